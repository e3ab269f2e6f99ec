"""TF Serving's REST API as a Starlette application over a `ModelServer`.

    GET  /v1/models/<name>[/versions/<version>]            the model's status
    GET  /v1/models/<name>[/versions/<version>]/metadata   its signatures and metadata.json
    POST /v1/models/<name>[/versions/<version>]:predict    predictions

Starlette routes (404 for other paths, 405 with Allow for other methods); every error,
routing's included, is TF Serving's `{"error": "..."}` with its HTTP status. `:predict`
bounds each body while reading it, the bytes of the bodies held as they arrive (past it the
rest is read and dropped, so that the client gets the answer and not a reset) and the
requests in flight once read (503 with Retry-After past either), parses off the event loop,
runs the network through the `Batcher`, and drops a request whose client has gone before
the network runs it.
"""

import asyncio
import concurrent.futures

from starlette.applications import Starlette
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from . import DEFAULT_MAX_BODY_MEMORY, DEFAULT_MAX_IN_FLIGHT, memory, protocol
from .batching import Batcher
from .connections import RETRY_AFTER_SECONDS
from .protocol import BadRequest

# The largest request body read: 64 encoded 224 x 224 JPEGs take about 2 MB.
MAX_BODY_BYTES = 64 * 2**20
# Threads that parse request bodies (JSON, base64, image headers), off the event loop: at
# most this many bodies are materialised at once.
PARSE_THREADS = 2


class TextConvertor(Convertor):
    """A path segment of a route kept as text; each subclass gives its pattern."""

    def convert(self, value):
        return value

    def to_string(self, value):
        return value


class ModelNameConvertor(TextConvertor):
    """A model's name: one path segment without ":" (":predict" follows it)."""

    regex = "[^/:]+"


class VersionConvertor(TextConvertor):
    """A version: digits, kept as text (a 5,000-digit version is no int Python parses)."""

    regex = "[0-9]+"


register_url_convertor("model_name", ModelNameConvertor())
register_url_convertor("model_version", VersionConvertor())


class ServingAPI:
    """The endpoints of TF Serving's REST API over `model`.

    Args:
        model: the ModelServer.
        max_in_flight: the most `:predict` requests parsed, queued or running at once;
            past it a request is answered 503 with Retry-After as soon as its body is read.
        batching: whether requests waiting together are run as one batch.
        max_body_memory: the most bytes of request bodies held at once, each counted as it
            arrives until its request is answered; past it the body is dropped as it is
            read and answered 503 with Retry-After.
    """

    def __init__(self, model, max_in_flight=DEFAULT_MAX_IN_FLIGHT, batching=True, max_body_memory=None):
        self.model, self.max_in_flight = model, max_in_flight
        self.max_body_memory = DEFAULT_MAX_BODY_MEMORY * 2**20 if max_body_memory is None else max_body_memory
        self.batcher = Batcher(model, batching=batching)
        self.parsing = concurrent.futures.ThreadPoolExecutor(PARSE_THREADS, thread_name_prefix="parse")
        self.in_flight = 0
        self.body_bytes = 0  # of the bodies held now

    def routes(self):
        routes = []
        for version in ("", "/versions/{version:model_version}"):
            base = "/v1/models/{name:model_name}" + version
            routes += [
                Route(base + ":predict", self.predict, methods=["POST"]),
                Route(base + "/metadata", self.metadata, methods=["GET"]),
                Route(base, self.status, methods=["GET"]),
            ]
        return routes

    def served(self, request):
        """The model, where the path names it and its version (a BadRequest otherwise)."""
        if request.path_params["name"] != self.model.name:
            raise not_found(request)
        self.model.check_version(request.path_params.get("version"))
        return self.model

    async def status(self, request):
        return JSONResponse(self.served(request).status())

    async def metadata(self, request):
        return JSONResponse(self.served(request).describe())

    async def predict(self, request):
        model = self.served(request)
        check_length(request)
        body_read = {"held": 0, "read": 0}  # held: the bytes counted in self.body_bytes
        try:
            body = await self.read_body(request, body_read)
            # Counted once its body is whole: a client that sends its body slowly holds its
            # bytes (within max_body_memory), never a slot that a whole request could use.
            if self.in_flight >= self.max_in_flight:
                raise BadRequest(
                    f"The server is busy: {self.max_in_flight} requests are in flight (--max-in-flight). "
                    f"Retry after {RETRY_AFTER_SECONDS} s.",
                    503,
                )
            self.in_flight += 1
            try:
                loop = asyncio.get_running_loop()
                parsed = await loop.run_in_executor(self.parsing, model.parse, body)  # up to 64 MiB: off the loop
                del body
                outputs = await unless_client_leaves(request, self.batcher.infer(parsed))
                return JSONResponse(await loop.run_in_executor(self.parsing, protocol.answer, parsed, outputs))
            finally:
                self.in_flight -= 1
        finally:
            self.body_bytes -= body_read["held"]
            if body_read["read"] >= memory.TRIM_AFTER_BYTES:
                # Once this request's objects are gone: the coroutine ends before the thread runs it.
                asyncio.get_running_loop().run_in_executor(self.parsing, memory.give_back)

    async def read_body(self, request, body_read):
        """The request body, each chunk counted in self.body_bytes (and body_read["held"])
        as it arrives, and in body_read["read"]; refused with a 413 as soon as it passes
        MAX_BODY_BYTES. Where the bodies held pass max_body_memory, the rest is read and
        dropped, then answered 503."""
        chunks, over = [], False
        async for chunk in request.stream():
            body_read["read"] += len(chunk)
            if body_read["read"] > MAX_BODY_BYTES:
                raise BadRequest(f"The request body is too large: at most {MAX_BODY_BYTES} bytes.", 413)
            if over:
                continue
            self.body_bytes += len(chunk)
            body_read["held"] += len(chunk)
            chunks.append(chunk)
            if self.body_bytes > self.max_body_memory:
                over = True
                chunks.clear()
                self.body_bytes -= body_read["held"]
                body_read["held"] = 0
        if over:
            raise BadRequest(
                f"The server is busy: the request bodies it holds pass {self.max_body_memory // 2**20} MiB "
                f"(--max-body-memory). Retry after {RETRY_AFTER_SECONDS} s.",
                503,
            )
        return b"".join(chunks)


def check_length(request):
    """A 413 for a Content-Length past MAX_BODY_BYTES, before the body is read (h11 has
    already checked its framing: a valid Content-Length or chunked encoding)."""
    length = request.headers.get("content-length")
    if length is not None and int(length) > MAX_BODY_BYTES:
        raise BadRequest(f"The request body is too large: at most {MAX_BODY_BYTES} bytes. Received: {length[:20]}", 413)


async def unless_client_leaves(request, work):
    """The result of the coroutine `work`, or a ClientDisconnect as soon as the client has
    gone (`receive` answers "http.disconnect" once the body is read and the connection
    closes: `connections.Exchange`): `work` is cancelled, and a request waiting for the
    network leaves the `Batcher`'s queue unrun."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not task.done():
        task.cancel()
        raise ClientDisconnect()
    return task.result()


async def disconnected(request):
    """Returns when the client of `request` (its body read) has gone."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def not_found(request):
    return BadRequest(
        f"No such resource: {request.method} {request.url.path[:200]}. This server serves "
        f"/v1/models/{request.app.state.model_name} (GET), .../metadata (GET) and ...:predict (POST).",
        404,
    )


def error(status, message, headers=None):
    """TF Serving's JSON error."""
    return JSONResponse({"error": message}, status, headers)


async def bad_request(request, exception):
    return error(
        exception.status, str(exception), {"Retry-After": str(RETRY_AFTER_SECONDS)} if exception.status == 503 else None
    )


async def routing_error(request, exception):
    if exception.status_code == 405:
        allowed = exception.headers["Allow"]
        return error(
            405,
            f"Method {request.method} is not allowed for {request.url.path[:200]}: use {allowed}.",
            {"Allow": allowed},
        )
    if exception.status_code == 404:
        return await bad_request(request, not_found(request))
    return error(exception.status_code, exception.detail)


async def server_error(request, exception):
    return error(500, f"{type(exception).__name__}: {(str(exception).splitlines() or [''])[0][:300]}")


async def client_left(request, exception):
    return Response(status_code=400)  # never sent: the client has gone


def application(model, max_in_flight=DEFAULT_MAX_IN_FLIGHT, batching=True, max_body_memory=None):
    """The Starlette application serving `model`; `max_body_memory` in bytes (`ServingAPI`)."""
    api = ServingAPI(model, max_in_flight, batching, max_body_memory)
    app = Starlette(
        routes=api.routes(),
        exception_handlers={
            BadRequest: bad_request,
            HTTPException: routing_error,
            ClientDisconnect: client_left,
            Exception: server_error,
        },
    )
    # A path with a trailing slash is a 404 like any other unknown path, not Starlette's
    # redirect to the URL without it, which names the host the client sent.
    app.router.redirect_slashes = False
    app.state.model_name = model.name
    app.state.api = api
    return app
