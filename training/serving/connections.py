"""HTTP/1.1 connections: each client's bytes parsed by h11, each request run by the ASGI application.

h11 (its public API: `h11.Connection` and its events) parses strictly: bodies framed
exactly by Content-Length or chunked encoding, heads bounded (MAX_HEAD_BYTES). Around it,
what a server facing hostile clients needs and no ASGI server offers through its settings
(measured in docs/serving.md: uvicorn has no deadline for a head; Hypercorn and Granian
close a slow head silently; all three answer malformed requests in plain text or empty):

- Each request must arrive whole (head and body) within `request_timeout` seconds of its
  connection opening or of the previous response: otherwise 408 and the connection closed
  (a client that trickles bytes holds nothing for long); an idle one is closed silently,
  and a kept-alive one after KEEP_ALIVE_SECONDS without a new request.
- At most `limit` connections: past it, 503 with Retry-After, and closed.
- Every error of the HTTP layer is TF Serving's JSON: 400 for what h11 refuses (the head's
  syntax, the body's chunked encoding), 414 or 431 for a request line or headers past
  MAX_HEAD_BYTES, 505 for another HTTP version, 400 for a request framed both ways.
- A request whose body the application did not read whole is answered once, then its
  connection closed: unread bytes are never read as a request. A refused connection is
  answered, its sending side closed, and closed when the client closes its own or after
  LINGER_SECONDS.
- A client that half-closes after a whole request is answered, then closed; one that
  leaves before its answer makes its request's `receive` answer "http.disconnect".
- Reading pauses while more than BUFFERED_BODY_BYTES of a body wait for the application
  (which bounds the memory of the bodies it holds), writing while the client reads slowly.
"""

import asyncio
import email.utils
import http
import json
import sys
import time
import urllib.parse

import h11

# The request line and headers together (h11's own default); past it, 414 or 431.
MAX_HEAD_BYTES = 16 * 2**10
# What a 503 asks the client to wait, in seconds.
RETRY_AFTER_SECONDS = 1
# Seconds a kept-alive connection may sit idle between requests (uvicorn's default, which this
# server kept).
KEEP_ALIVE_SECONDS = 5
# Seconds a refused connection stays open for its client to read the answer and close.
LINGER_SECONDS = 1
# Bytes of a body received and not yet taken by the application before reading pauses
# (uvicorn's high-water mark, which this server kept).
BUFFERED_BODY_BYTES = 64 * 2**10
INVALID_REQUEST = (
    "Invalid HTTP request: it does not follow HTTP/1.1 (RFC 9112), for example a malformed request "
    "line or header, or a Content-Length that is not a number of bytes."
)
INVALID_BODY = "Invalid HTTP request: its body does not follow HTTP/1.1's chunked encoding (RFC 9112, section 7.1)."


def error_response(status, message):
    """TF Serving's JSON error as raw HTTP/1.1 bytes, closing the connection."""
    body = json.dumps({"error": message}).encode()
    head = (
        f"HTTP/1.1 {status} {phrase(status).decode()}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n"
    )
    if status == 503:
        head += f"retry-after: {RETRY_AFTER_SECONDS}\r\n"
    return (head + "\r\n").encode() + body


def phrase(status):
    """The reason phrase of an HTTP status, or b"" for a status HTTP does not name."""
    try:
        return http.HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


def head_refused(received):
    """The status and message for a head h11 refused, from the bytes received of it."""
    if len(received) > MAX_HEAD_BYTES and b"\r\n" not in received:
        return 414, f"The request line is too long: at most {MAX_HEAD_BYTES} bytes with the headers."
    if len(received) > MAX_HEAD_BYTES:
        return 431, f"The request's headers are too large: at most {MAX_HEAD_BYTES} bytes."
    return 400, INVALID_REQUEST


def refusal(request):
    """The status and message for a head h11 parsed and this server refuses, or None: one
    that arrived at once past MAX_HEAD_BYTES, another HTTP version, or a request framed both
    ways (RFC 9112, section 6.1: it may be a smuggling attempt)."""
    if len(request.target) > MAX_HEAD_BYTES:
        return 414, f"The request line is too long: at most {MAX_HEAD_BYTES} bytes."
    if sum(len(name) + len(value) + 4 for name, value in request.headers) > MAX_HEAD_BYTES:
        return 431, f"The request's headers are too large: at most {MAX_HEAD_BYTES} bytes."
    if request.http_version not in (b"1.0", b"1.1"):
        return 505, f"HTTP/{request.http_version[:10].decode()} is not supported: this server speaks HTTP/1.1."
    names = {name for name, _ in request.headers}
    if b"content-length" in names and b"transfer-encoding" in names:
        return 400, "The request has both Content-Length and Transfer-Encoding: send one of them."
    return None


class Connections:
    """The open connections of one server, each running `app` (ASGI) for its requests.

    Args:
        app: the ASGI application.
        request_timeout: seconds each request has to arrive whole.
        limit: the most connections open at once.
        access_log: whether each answered request is printed (to stderr).
    """

    def __init__(self, app, request_timeout, limit, access_log=False):
        self.app, self.request_timeout, self.limit, self.access_log = app, request_timeout, limit, access_log
        self.open = set()
        self.running = set()  # the exchanges' tasks: the event loop keeps only weak references
        self.stopping = False

    def protocol(self):
        """A new connection's asyncio protocol (`loop.create_server`'s factory)."""
        return Connection(self)

    def stop(self):
        """Closes the idle connections; the others close once their request is answered."""
        self.stopping = True
        for connection in list(self.open):
            if connection.exchange is None:
                connection.transport.close()

    def abort(self):
        """Closes every connection at once."""
        for connection in list(self.open):
            connection.transport.abort()


class Connection(asyncio.Protocol):
    """One client connection: h11's parser, a deadline, a bound and JSON errors."""

    def __init__(self, connections):
        self.connections = connections
        self.parser = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.transport = self.exchange = self.deadline = self.idle = None
        self.client = self.server = None
        self.received, self.half_closed, self.reading, self.ended = b"", False, True, False
        self.writable = asyncio.Event()
        self.writable.set()

    def connection_made(self, transport):
        self.transport = transport
        if len(self.connections.open) >= self.connections.limit:
            self.refuse(
                503,
                f"The server is busy: {self.connections.limit} connections are open. Retry after {RETRY_AFTER_SECONDS} s.",
            )
            return
        self.client = tuple(transport.get_extra_info("peername")[:2])
        self.server = tuple(transport.get_extra_info("sockname")[:2])
        self.connections.open.add(self)
        self.start_deadline()

    def data_received(self, data):
        if self.ended:  # refused: what the client still sends is dropped
            return
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None
        if self.exchange is None and len(self.received) <= MAX_HEAD_BYTES:
            self.received += data[: MAX_HEAD_BYTES + 1 - len(self.received)]
        elif self.exchange is not None and self.exchange.body_whole and self.parser.their_state is not h11.DONE:
            return  # after a request that closes its connection: never read as one
        self.parser.receive_data(data)
        self.handle_events()

    def eof_received(self):
        """A client that half-closes after a whole request is answered, then closed; one that
        half-closes in the middle of a request has left (asyncio then closes the transport)."""
        if not self.ended and self.exchange is not None and self.exchange.body_whole:
            self.half_closed = True
            return True
        return None

    def connection_lost(self, exc):
        for timer in (self.deadline, self.idle):
            if timer is not None:
                timer.cancel()
        self.connections.open.discard(self)
        if self.exchange is not None:
            self.exchange.leave()
        self.writable.set()

    def pause_writing(self):
        self.writable.clear()

    def resume_writing(self):
        self.writable.set()

    # Reading h11's events.

    def handle_events(self):
        while not self.closing():
            try:
                event = self.parser.next_event()
            except h11.RemoteProtocolError:
                if self.exchange is not None and self.exchange.body_whole:
                    return  # bytes after a request that closes its connection: dropped
                if self.exchange is None:
                    self.refuse(*head_refused(self.received))
                else:
                    self.cut_off(400, INVALID_BODY)
                return
            if event is h11.NEED_DATA:
                return
            if event is h11.PAUSED:  # a next request already sent: read once this one is answered
                self.pause_reading()
                return
            if isinstance(event, h11.Request):
                self.start(event)
            elif isinstance(event, h11.Data):
                self.exchange.take(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self.exchange.end()

    def start(self, request):
        refused = refusal(request)
        if refused is not None:
            self.refuse(*refused)
            return
        raw_path, _, query = request.target.partition(b"?")
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": request.http_version.decode(),
            "server": self.server,
            "client": self.client,
            "scheme": "http",
            "method": request.method.decode(),
            "root_path": "",
            "path": urllib.parse.unquote(raw_path.decode("latin-1")),
            "raw_path": raw_path,
            "query_string": query,
            "headers": list(request.headers),
        }
        self.exchange = Exchange(self, scope)
        task = asyncio.get_running_loop().create_task(self.exchange.run())
        self.connections.running.add(task)
        task.add_done_callback(self.connections.running.discard)

    def answered(self):
        """The exchange's response is sent: the next request, or the connection closed."""
        if (
            self.parser.our_state is not h11.DONE
            or self.parser.their_state is not h11.DONE
            or self.half_closed
            or self.connections.stopping
        ):
            self.transport.close()
            return
        self.parser.start_next_cycle()
        self.exchange, self.received = None, b""
        self.start_deadline()
        self.idle = asyncio.get_running_loop().call_later(KEEP_ALIVE_SECONDS, self.idle_passed)
        self.resume_reading()
        self.handle_events()  # a request sent before this answer

    # Flow control.

    def pause_reading(self):
        if self.reading and not self.transport.is_closing():
            self.reading = False
            self.transport.pause_reading()

    def resume_reading(self):
        if not self.reading and not self.transport.is_closing():
            self.reading = True
            self.transport.resume_reading()

    def write(self, data):
        if not self.closing():
            self.transport.write(data)

    def closing(self):
        return self.ended or self.transport.is_closing()

    # Errors, the deadline and the bound.

    def refuse(self, status, message):
        """Answers TF Serving's JSON error and ends the connection: the answer, then the end of
        what this side sends, so that the client reads it whole; the connection closes when the
        client closes its side, or after LINGER_SECONDS (closing at once would reset a client
        that is still sending, and the reset can destroy the answer before it is read)."""
        self.write(error_response(status, message))
        self.ended = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        asyncio.get_running_loop().call_later(LINGER_SECONDS, self.transport.close)

    def cut_off(self, status, message):
        """Ends the request under way: answered `status` if its response has not started
        (the application's own answer is dropped), and the connection closed."""
        exchange = self.exchange
        exchange.leave()
        if exchange.started:
            self.transport.close()
        else:
            self.refuse(status, message)

    def start_deadline(self):
        if self.deadline is not None:
            self.deadline.cancel()
        self.deadline = asyncio.get_running_loop().call_later(self.connections.request_timeout, self.deadline_passed)

    def deadline_passed(self):
        if self.closing():
            return
        if self.exchange is None and not self.received:
            self.transport.close()  # an idle connection: nothing to answer
        elif self.exchange is None:
            self.refuse(408, self.late())
        elif not (self.exchange.body_whole or self.exchange.started):
            self.cut_off(408, self.late())

    def late(self):
        return f"The request did not arrive whole within {self.connections.request_timeout:g} s (--request-timeout)."

    def idle_passed(self):
        self.idle = None
        if self.exchange is None and not self.received:
            self.transport.close()


class Exchange:
    """One request and its response: the ASGI `receive` and `send` the application runs with."""

    def __init__(self, connection, scope):
        self.connection, self.scope = connection, scope
        self.chunks, self.buffered, self.body_bytes = [], 0, 0
        self.body_whole = self.end_taken = self.gone = self.started = self.finished = False
        self.status, self.headers = None, []
        self.arrived = asyncio.Event()  # body bytes, the body's end, the response's end or the client gone

    async def run(self):
        try:
            await self.connection.connections.app(self.scope, self.receive, self.send)
        except Exception as error:  # the application's handlers answered it if they could
            print(
                f"error: {self.scope['method']} {self.scope['path'][:200]}: {type(error).__name__}: {error}",
                file=sys.stderr,
            )
            if not self.started and not self.gone:
                self.connection.cut_off(500, f"{type(error).__name__}: {str(error)[:300]}")
        if not self.finished and not self.connection.closing():
            self.connection.cut_off(500, "The server ended the request without an answer.")
        if self.connection.connections.access_log and self.status is not None:
            print(
                f'{self.scope["client"][0]}:{self.scope["client"][1]} - "{self.scope["method"]} '
                f'{self.scope["path"][:200]} HTTP/{self.scope["http_version"]}" {self.status}',
                file=sys.stderr,
                flush=True,
            )

    # What the connection hands it.

    def take(self, data):
        self.chunks.append(data)
        self.buffered += len(data)
        self.body_bytes += len(data)
        self.arrived.set()
        if self.buffered > BUFFERED_BODY_BYTES:
            self.connection.pause_reading()

    def end(self):
        self.body_whole = True
        self.arrived.set()

    def leave(self):
        self.gone = True
        self.arrived.set()

    # The application's side.

    async def receive(self):
        parser = self.connection.parser
        if parser.they_are_waiting_for_100_continue and not self.gone:
            self.connection.write(
                parser.send(h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue"))
            )
        while not (self.gone or self.finished or self.chunks or (self.body_whole and not self.end_taken)):
            self.connection.resume_reading()  # reading also tells when the client leaves
            self.arrived.clear()
            await self.arrived.wait()
        if self.gone or self.finished:
            return {"type": "http.disconnect"}
        body = b"".join(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        self.end_taken = self.body_whole
        return {"type": "http.request", "body": body, "more_body": not self.body_whole}

    async def send(self, message):
        if self.gone:
            return
        parser, kind = self.connection.parser, message["type"]
        if kind == "http.response.start" and not self.started:
            self.started = True
            self.status = message["status"]
            self.headers = [(name.lower(), value) for name, value in message.get("headers", [])]
            if not (self.end_taken or (self.body_whole and not self.body_bytes)):
                self.headers.append((b"connection", b"close"))  # what the application left unread never is
            self.headers.append((b"date", email.utils.formatdate(time.time(), usegmt=True).encode()))
            response = h11.Response(status_code=self.status, headers=self.headers, reason=phrase(self.status))
            self.connection.write(parser.send(response))
        elif kind == "http.response.body" and self.started and not self.finished:
            if message.get("body") and self.scope["method"] != "HEAD":
                self.connection.write(parser.send(h11.Data(data=message["body"])))
            if not message.get("more_body", False):
                self.connection.write(parser.send(h11.EndOfMessage()))
                self.finished = True
                self.arrived.set()
                self.connection.answered()
            await self.connection.writable.wait()
        else:
            raise RuntimeError(f"An ASGI message out of order: {kind} (response started: {self.started}).")
