"""`keras-preact serve`: the application served by Hypercorn on a socket opened first, until
Ctrl-C or SIGTERM.

Hypercorn (`bench/http_servers.py` measured it beside uvicorn and Granian, docs/serving.md) holds
the connections through its public settings: a request's head must arrive within
`request_timeout` of the connection opening or of the previous answer (its keep-alive timeout,
which a head sent a byte at a time does not restart), heads are bounded in size, and a client
that does not read its answers stops being read (each answer waits for the socket to drain).
The application bounds what the server cannot: the body's arrival and the grace given to the
requests under way at SIGTERM (`application.ServingAPI`). The server speaks HTTP/1.1 alone, as
TF Serving's REST API does (`http1_only`).
"""

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys

from ..export import contract
from . import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_BODY_MEMORY,
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_PORT,
    DEFAULT_REQUEST_TIMEOUT,
    memory,
)
from .application import MAX_BODY_BYTES, MAX_HEAD_BYTES, METHOD_HEADER, application
from .model import ModelServer, runtime_formats

# Connections waiting to be accepted (the standard library's default of 5 reset clients at
# 32 concurrent connections).
LISTEN_BACKLOG = 1024
# Seconds the requests under way have to be answered once the server is told to stop; past them,
# 503. Hypercorn waits one second more, so that the 503s are written.
STOP_SECONDS = 5


def serve(
    directory,
    host="127.0.0.1",
    port=DEFAULT_PORT,
    max_batch=DEFAULT_MAX_BATCH,
    verbose=False,
    max_in_flight=DEFAULT_MAX_IN_FLIGHT,
    request_timeout=DEFAULT_REQUEST_TIMEOUT,
    batching=True,
    runtime="auto",
    precision="float32",
    max_body_memory=DEFAULT_MAX_BODY_MEMORY,
):
    """Serves the highest version of `directory` until interrupted (Ctrl-C or SIGTERM).

    `runtime` "auto" serves with onnxruntime where the highest version has ONNX models
    and onnxruntime is installed (faster: see docs/serving.md), with TensorFlow otherwise;
    `precision` "int8" serves the int8 ONNX models (`export --quantize int8`), with onnxruntime;
    `max_body_memory`: the most mebibytes of request bodies held at once (past it: 503)."""
    check_options(port, max_in_flight, max_body_memory, request_timeout)
    memory.map_large_blocks_apart()
    if runtime == "auto" and precision != "float32":
        runtime = "onnxruntime"
    model = (
        auto_model(directory, max_batch) if runtime == "auto" else ModelServer(directory, max_batch, runtime, precision)
    )
    listening = listening_socket(host, port)  # clients queue from here on
    app = application(model, max_in_flight, batching, max_body_memory * 2**20, request_timeout)
    print(
        f"Serving {model.name} version {model.version} ({model.path}, {model.runtime.name}) at "
        f"http://{host}:{listening.getsockname()[1]}/v1/models/{model.name}",
        flush=True,
    )
    run_loop(run(app, server_config(listening, request_timeout, verbose)))


def check_options(port, max_in_flight, max_body_memory, request_timeout):
    """Raises ValueError, naming it, for an option of `serve` outside what it accepts."""
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an integer from 0 (any free port) to 65535. Received: port={port!r}")
    if not isinstance(max_in_flight, int) or max_in_flight < 1:
        raise ValueError(f"max_in_flight must be a positive integer. Received: max_in_flight={max_in_flight!r}")
    if not isinstance(max_body_memory, int) or isinstance(max_body_memory, bool) or max_body_memory < 1:
        raise ValueError(
            f"max_body_memory must be a positive integer (mebibytes). Received: max_body_memory={max_body_memory!r}"
        )
    if not isinstance(request_timeout, (int, float)) or not 0 < request_timeout < float("inf"):
        raise ValueError(
            f"request_timeout must be a positive number of seconds. Received: request_timeout={request_timeout!r}"
        )


def run_loop(coroutine):
    """Runs `coroutine` on uvloop's event loop where uvloop is installed (libuv's, on which the
    server answers a lone client about 1.5 times as fast as on asyncio's: docs/benchmarks.md),
    on asyncio's otherwise."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def http1_only():
    """Hypercorn without HTTP/2 and WebSocket on plain TCP. It would switch a connection to
    HTTP/2 for a client that opens with HTTP/2's preface or asks for `Upgrade: h2c`, and its
    HTTP/2 protocol let client frames end in tracebacks in the log (a CONNECT without `:path`:
    UnboundLocalError) and bounds neither a stream's frames nor a flow-controlled connection as
    the HTTP/1.1 path does; it would take a request with `Upgrade: websocket` as a WebSocket
    handshake, and a bad one was answered 400 without a body and its connection kept open for
    as long as the client kept it. TF Serving's REST API is HTTP/1.1 alone. With this, the
    preface is read as an HTTP/1.1 request line of version 2.0, answered 505 in TF Serving's
    JSON (`application.refused`), and every request asking for an upgrade is answered as the
    HTTP/1.1 request it also is (its `Upgrade` header dropped before Hypercorn reads it).

    The same wrapper does two things more at a request's start. A request that says
    `Expect: 100-continue` and a Content-Length past `application.MAX_BODY_BYTES` is not told
    to go on (Hypercorn would answer `100 Continue` before the application's 413): the 413
    comes first, and the body is never invited. And the method as the client sent it goes to
    the application in the header `application.METHOD_HEADER` (a client's own header of that
    name dropped), for Hypercorn upper-cases methods and HTTP's are case-sensitive (RFC 9110,
    section 9.1): `get` is no `GET`.

    Hypercorn offers no public setting for either: this replaces its private
    `hypercorn.protocol.h11.H11Protocol._check_protocol` (the switch to HTTP/2, and nothing else)
    and wraps `_create_stream` (which picks a WebSocket stream by that header), both in the
    pinned hypercorn>=0.18,<0.19; tests/test_serving_battery.py names them and fails when they
    change."""
    import h11
    from hypercorn.protocol.h11 import H11Protocol

    if getattr(H11Protocol, "http1_only", False):
        return
    create_stream = H11Protocol._create_stream

    async def stay_on_http1(self, event):
        return None

    async def create_http_stream(self, request):
        dropped = (b"upgrade", METHOD_HEADER.encode())
        headers = [(name, value) for name, value in request.headers if name.lower() not in dropped]
        request = h11.Request(
            method=request.method,
            target=request.target,
            headers=[*headers, (METHOD_HEADER.encode(), request.method)],
            http_version=request.http_version,
        )
        if too_large(headers):
            self.connection.client_is_waiting_for_100_continue = False
        return await create_stream(self, request)

    H11Protocol._check_protocol = stay_on_http1
    H11Protocol._create_stream = create_http_stream
    H11Protocol.http1_only = True


def too_large(headers):
    """Whether a request's headers (h11's, lower-case names) announce a body past MAX_BODY_BYTES."""
    lengths = [value for name, value in headers if name == b"content-length"]
    return bool(lengths) and lengths[0].isdigit() and int(lengths[0]) > MAX_BODY_BYTES


def connection_bounds():
    """(connections served at once, connections being refused at once): a half and a quarter of
    the process's limit on open files (`ulimit -n`; 512 and 256 under the usual 1,024), at most
    4,096 and 1,024, so that descriptors remain for the model, the logs and the threads however
    many clients connect."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    soft = 1024 if soft == resource.RLIM_INFINITY else soft
    return max(8, min(4096, soft // 2)), max(4, min(1024, soft // 4))


def bound_connections(served, refusing):
    """Hypercorn serving at most `served` connections at once: past them a connection is answered
    503 in TF Serving's JSON (with Retry-After) and closed once the client's first bytes are read
    (at most REFUSAL_SECONDS), so that its answer is not lost to a reset; past `refusing` of
    those at once, a connection is reset at once. A client already connected is answered as
    before, and the connections' descriptors stay well under the process's limit.

    Hypercorn offers no public setting for it: this wraps the private
    `hypercorn.asyncio.tcp_server.TCPServer.run(self)`, one connection's life, in the pinned
    hypercorn>=0.18,<0.19; tests/test_serving_battery.py names it and fails when it changes."""
    from hypercorn.asyncio.tcp_server import TCPServer

    run = getattr(TCPServer, "unbounded_run", TCPServer.run)
    counts = {"served": 0, "refusing": 0}

    async def bounded_run(self):
        if counts["served"] < served:
            counts["served"] += 1
            try:
                return await run(self)
            finally:
                counts["served"] -= 1
        if counts["refusing"] >= refusing:
            self.writer.transport.abort()
            return None
        counts["refusing"] += 1
        try:
            await refuse(self.reader, self.writer, served)
        finally:
            counts["refusing"] -= 1
        return None

    TCPServer.unbounded_run = run
    TCPServer.run = bounded_run


# Seconds a refused connection has to send its request before it is closed.
REFUSAL_SECONDS = 1.0


async def refuse(reader, writer, served):
    """Answers one connection 503 without reading its request, then closes it."""
    body = json.dumps(
        {"error": f"The server is serving {served} connections, its most at once: try again in a moment."}
    ).encode()
    writer.write(
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"retry-after: 1\r\nconnection: close\r\n\r\n%s" % (len(body), body)
    )
    try:
        writer.write_eof()
        # The request read, so that closing with unread bytes does not reset the connection.
        await asyncio.wait_for(read_to_end(reader), REFUSAL_SECONDS)
    except (OSError, asyncio.TimeoutError, RuntimeError):
        pass
    if writer.transport.get_write_buffer_size():
        writer.transport.abort()  # a client that reads nothing gets no more of the server's time
    else:
        writer.close()


async def read_to_end(reader):
    while await reader.read(2**16):
        pass


def server_config(listening, request_timeout, access_log=False):
    """Hypercorn's settings: `listening` served, heads bounded in time and size, stopping within
    STOP_SECONDS, an access log on standard output where asked for; HTTP/1.1 alone (`http1_only`)."""
    import hypercorn.config

    http1_only()
    bound_connections(*connection_bounds())

    config = hypercorn.config.Config()
    config.bind = [f"fd://{listening.fileno()}"]
    config.backlog = LISTEN_BACKLOG
    config.keep_alive_timeout = request_timeout
    config.h11_max_incomplete_size = MAX_HEAD_BYTES
    config.graceful_timeout = STOP_SECONDS + 1
    config.accesslog = "-" if access_log else None
    config.loglevel = "WARNING"
    config.include_server_header = False
    return config


async def run(app, config):
    """Serves `app` until SIGINT or SIGTERM; then gives the requests under way STOP_SECONDS
    (`ServingAPI.stop`) while Hypercorn closes the idle connections."""
    import hypercorn.asyncio

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(number, stop.set)

    async def stopped():
        await stop.wait()
        app.state.api.stop(STOP_SECONDS)

    await hypercorn.asyncio.serve(app, config, shutdown_trigger=stopped)


def listening_socket(host, port):
    """A TCP socket listening on host:port with LISTEN_BACKLOG, opened before the model is
    loaded so that a busy port is one clear line. Created with IPPROTO_TCP: asyncio sets
    TCP_NODELAY on the connections it accepts only from a socket whose protocol says TCP, and
    without it Nagle's algorithm holds every kept-alive response after the first for a
    delayed ACK (about 40 ms)."""
    listening = socket.socket(
        socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
    )
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host, port))
    except OSError as error:
        listening.close()
        raise ValueError(
            f"Cannot listen on {host}:{port}: {error.strerror or error} (is another server using "
            f"the port? choose another with --port). Received: port={port}"
        ) from error
    listening.listen(LISTEN_BACKLOG)
    return listening


def auto_model(directory, max_batch=DEFAULT_MAX_BATCH):
    """The ModelServer of `runtime="auto"`: onnxruntime where the highest version has ONNX
    models and onnxruntime is installed; TensorFlow otherwise, and (with a warning that
    says why) where the ONNX models cannot be served."""
    if onnx_servable(directory):
        try:
            return ModelServer(directory, max_batch, "onnxruntime")
        except (ValueError, FileNotFoundError, ImportError) as error:
            print(
                f"warning: serving the SavedModel with TensorFlow instead of the ONNX models: {error}",
                file=sys.stderr,
                flush=True,
            )
    return ModelServer(directory, max_batch, "tensorflow")


def serves_onnx(directory, runtime, precision="float32"):
    """Whether `serve(directory, runtime=runtime, precision=precision)` starts with onnxruntime
    (TensorFlow is then imported only if the ONNX models cannot be served and "auto" falls back)."""
    return runtime == "onnxruntime" or (runtime == "auto" and (precision != "float32" or onnx_servable(directory)))


def onnx_servable(directory):
    """Whether onnxruntime is installed and the newest complete version of `directory` (of
    either runtime's files, `contract.latest_version`) has complete ONNX models."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    newest = {}
    for runtime, served in runtime_formats().items():
        with contextlib.suppress(FileNotFoundError):
            newest[runtime] = int(os.path.basename(contract.latest_version(directory, served.name)))
    return "onnxruntime" in newest and newest["onnxruntime"] >= max(newest.values())
