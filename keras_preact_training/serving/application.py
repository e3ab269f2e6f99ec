"""TF Serving's REST API as a Starlette application over a `ModelServer`.

    GET  /v1/models/<name>[/versions/<version>]            the model's status
    GET  /v1/models/<name>[/versions/<version>]/metadata   its signatures and metadata.json
    POST /v1/models/<name>[/versions/<version>]:predict    predictions

Starlette routes (404 for other paths, 405 with Allow for other methods); every error,
routing's included, is TF Serving's `{"error": "..."}` with its HTTP status. `:predict`
bounds each body while reading it, in size and in time (408 past `request_timeout`), the
bytes of the bodies held as they arrive (past it the rest is read and dropped, so that the
client gets the answer and not a reset) and the requests in flight once read (503 with
Retry-After past either), parses off the event loop, runs the network through the `Batcher`,
drops a request whose client has gone before the network runs it, and answers 503 to the
requests still under way when the grace of a stopping server ends (`ServingAPI.stop`).
"""

import asyncio
import concurrent.futures
import urllib.parse

from starlette.applications import Starlette
from starlette.convertors import Convertor, register_url_convertor
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse
from starlette.routing import Route

from . import DEFAULT_MAX_BODY_MEMORY, DEFAULT_MAX_IN_FLIGHT, DEFAULT_REQUEST_TIMEOUT, memory, protocol
from .batching import Batcher
from .protocol import BadRequest

# The largest request body read: 64 encoded 224 x 224 JPEGs take about 2 MB.
MAX_BODY_BYTES = 64 * 2**20
# The largest request line and the largest headers, bytes (past them: 414, 431). The server
# refuses a head past MAX_HEAD_BYTES while it arrives in pieces (its 431, empty, the connection
# closed); one that arrives in one read (up to 64 KiB) reaches the application, which refuses it.
MAX_HEAD_BYTES = 16 * 2**10
# The header in which the server passes a request's method as the client sent it
# (`server.http1_only`): Hypercorn gives the application the method upper-cased.
METHOD_HEADER = "x-keras-preact-method"
# Where a request's scope says its body was read whole (`ServingAPI.read_body`).
BODY_READ = "keras_preact.body_read"
# The seconds a client told "busy" (503) is asked to wait (its Retry-After header).
RETRY_AFTER_SECONDS = 1
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
        request_timeout: the seconds a request's body has to arrive whole once its head has
            (past them: 408 and the connection closed).
    """

    def __init__(
        self,
        model,
        max_in_flight=DEFAULT_MAX_IN_FLIGHT,
        batching=True,
        max_body_memory=None,
        request_timeout=DEFAULT_REQUEST_TIMEOUT,
    ):
        self.model, self.max_in_flight, self.request_timeout = model, max_in_flight, request_timeout
        self.max_body_memory = DEFAULT_MAX_BODY_MEMORY * 2**20 if max_body_memory is None else max_body_memory
        self.batcher = Batcher(model, batching=batching)
        self.parsing = concurrent.futures.ThreadPoolExecutor(PARSE_THREADS, thread_name_prefix="parse")
        self.large_parsing = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="parse-large")
        self.in_flight = 0
        self.body_bytes = 0  # of the bodies held now
        self.grace_over = asyncio.Event()  # set once a stopping server's requests had their time

    def stop(self, grace_seconds):
        """The server stops: the requests under way are answered 503 after `grace_seconds`."""
        asyncio.get_running_loop().call_later(grace_seconds, self.grace_over.set)

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
        """The request's answer; a 503 where the server stops before it is ready."""
        stopping = BadRequest("The server is stopping and could not answer in time: send the request again.", 503)
        return await unless(self.answer(request), self.grace_over.wait(), stopping)

    async def answer(self, request):
        model = self.served(request)
        check_length(request)
        body_read = {"held": 0, "read": 0}  # held: the bytes counted in self.body_bytes
        try:
            try:
                body = await asyncio.wait_for(self.read_body(request, body_read), self.request_timeout)
            except asyncio.TimeoutError:
                raise BadRequest(
                    f"The request body did not arrive whole within {self.request_timeout:g} s (--request-timeout).", 408
                ) from None
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
                # The trial decode of a large request's images on a thread of its own, as its
                # decoding later: however many such requests arrive, a parse thread is left.
                checking = self.large_parsing if self.batcher.is_large(parsed) else self.parsing
                await loop.run_in_executor(checking, model.check_decoding, parsed)
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
        request.scope[BODY_READ] = True
        if over:
            raise BadRequest(
                f"The server is busy: the request bodies it holds pass {self.max_body_memory // 2**20} MiB "
                f"(--max-body-memory). Retry after {RETRY_AFTER_SECONDS} s.",
                503,
            )
        return b"".join(chunks)


def check_length(request):
    """A 413 for a Content-Length past MAX_BODY_BYTES, before the body is read (the server has
    already checked its framing: a valid Content-Length or chunked encoding)."""
    length = request.headers.get("content-length")
    if length is not None and int(length) > MAX_BODY_BYTES:
        raise BadRequest(f"The request body is too large: at most {MAX_BODY_BYTES} bytes. Received: {length[:20]}", 413)


async def unless_client_leaves(request, work):
    """The result of the coroutine `work`, or a ClientDisconnect as soon as the client has
    gone (`receive` answers "http.disconnect" once the body is read and the connection
    closes): `work` is cancelled, and a request waiting for the
    network leaves the `Batcher`'s queue unrun."""
    return await unless(work, disconnected(request), ClientDisconnect())


async def unless(work, event, refusal):
    """The result of the coroutine `work`, or `refusal` raised as soon as the coroutine `event`
    returns first (`work` then cancelled)."""
    task = asyncio.ensure_future(work)
    happened = asyncio.ensure_future(event)
    try:
        await asyncio.wait({task, happened}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        happened.cancel()
    if not task.done():
        task.cancel()
        raise refusal
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


def error(request, status, message, headers=None):
    """TF Serving's JSON error; it closes the connection where the request's body was not
    read whole (the server would otherwise read the rest, however long it takes to come)."""
    headers = dict(headers or {})
    if body_unread(request):
        headers["Connection"] = "close"
    return JSONResponse({"error": message}, status, headers)


def body_unread(request):
    has_body = "transfer-encoding" in request.headers or request.headers.get("content-length", "0") != "0"
    return has_body and not request.scope.get(BODY_READ)


async def bad_request(request, exception):
    retry = {"Retry-After": str(RETRY_AFTER_SECONDS)} if exception.status == 503 else None
    return error(request, exception.status, str(exception), retry)


async def routing_error(request, exception):
    if exception.status_code == 405:
        allowed = exception.headers["Allow"]
        return error(
            request,
            405,
            f"Method {request.method} is not allowed for {request.url.path[:200]}: use {allowed}.",
            {"Allow": allowed},
        )
    if exception.status_code == 404:
        return await bad_request(request, not_found(request))
    return error(request, exception.status_code, exception.detail)


async def server_error(request, exception):
    return error(request, 500, f"{type(exception).__name__}: {(str(exception).splitlines() or [''])[0][:300]}")


async def client_left(request, exception):
    """Sent only where the client closed its side of the connection alone (a half-close, which
    the server reports as the client's leaving): its request was dropped unanswered."""
    return error(
        request, 400, "The client closed its side of the connection before the answer: the request was dropped."
    )


class RequestChecks:
    """ASGI middleware, before routing: an HTTP version other than 1.0 and 1.1 is refused
    with 505, a request line past MAX_HEAD_BYTES with 414, headers past it with 431, a request
    with both Content-Length and Transfer-Encoding with 400 (RFC 9112, section 6.1: h11 would
    read it as chunked and keep the connection), each closing the connection. The others are
    routed by their target's path as `routed_path` reads it."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            refusal = refused(scope)
            if refusal is not None:
                status, message = refusal
                answer = JSONResponse({"error": message}, status, {"Connection": "close"})
                return await answer(scope, receive, send)
            scope = dict(scope, path=routed_path(scope["raw_path"]))
        await self.app(scope, receive, send)


def routed_path(target):
    """The path a request target (bytes, as sent) is routed by: the path of an absolute-form
    target (`http://host/v1/...`, which a server must accept: RFC 9112, section 3.2.2), each
    segment percent-decoded, and an encoded "/" (%2F) kept encoded, so that it stays part of
    its segment (a model's name) rather than separating two."""
    text = target.decode("latin-1")
    if text.lower().startswith(("http://", "https://")):
        text = urllib.parse.urlsplit(text).path or "/"
    segments = [urllib.parse.unquote(segment, errors="replace") for segment in text.split("/")]
    return "/".join(segment.replace("/", "%2F") for segment in segments)


def refused(scope):
    """(status, message) for a request RequestChecks refuses; None for the others."""
    version = scope.get("http_version", "1.1")
    # h11 reads "HTTP/3.0" in a request line as HTTP/1.1, and HTTP/2's preface as a request of
    # version 2.0 (the server speaks no HTTP/2: server.http1_only).
    if version not in ("1.0", "1.1"):
        return 505, f"HTTP/{version} is not supported: this server speaks HTTP/1.1."
    line = len(scope["method"]) + len(scope["raw_path"]) + len(scope.get("query_string", b"")) + 11
    headers = sum(len(name) + len(value) + 4 for name, value in scope["headers"] if name != METHOD_HEADER.encode())
    if line > MAX_HEAD_BYTES:
        return 414, f"The request line is too long: at most {MAX_HEAD_BYTES} bytes. Received: {line} bytes"
    if headers > MAX_HEAD_BYTES:
        return 431, f"The request's headers are too large: at most {MAX_HEAD_BYTES} bytes. Received: {headers} bytes"
    names = {name.lower() for name, _ in scope["headers"]}
    if {b"content-length", b"transfer-encoding"} <= names:
        return 400, "The request has both Content-Length and Transfer-Encoding: send one of them."
    sent = dict(scope["headers"]).get(METHOD_HEADER.encode())
    if sent is not None and sent.decode("latin-1") != scope["method"]:
        return 405, (
            f"Method {sent.decode('latin-1')[:20]!r} is not allowed: methods are case-sensitive (RFC 9110, "
            "section 9.1); use GET or POST."
        )
    return None


def application(
    model,
    max_in_flight=DEFAULT_MAX_IN_FLIGHT,
    batching=True,
    max_body_memory=None,
    request_timeout=DEFAULT_REQUEST_TIMEOUT,
):
    """The Starlette application serving `model`; `max_body_memory` in bytes (`ServingAPI`)."""
    api = ServingAPI(model, max_in_flight, batching, max_body_memory, request_timeout)
    app = Starlette(
        routes=api.routes(),
        exception_handlers={
            BadRequest: bad_request,
            HTTPException: routing_error,
            ClientDisconnect: client_left,
            Exception: server_error,
        },
    )
    app.add_middleware(RequestChecks)
    # A path with a trailing slash is a 404 like any other unknown path, not Starlette's
    # redirect to the URL without it, which names the host the client sent.
    app.router.redirect_slashes = False
    app.state.model_name = model.name
    app.state.api = api
    return app
