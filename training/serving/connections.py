"""What uvicorn lacks against hostile clients (Kludex/uvicorn#157), around its h11 protocol.

uvicorn parses HTTP/1.1 with h11, strictly: bodies framed exactly by Content-Length or
chunked encoding, heads bounded (`h11_max_incomplete_event_size`), kept-alive connections
closed when idle. It has no deadline for receiving a request, no bound on open
connections, and answers malformed requests in plain text. `Connection` adds them by
composition: it is the asyncio protocol uvicorn runs (`uvicorn.Config(http=...)`), and it
hands every event to uvicorn's own h11 protocol, which it holds.

- Each request must arrive whole (head and body) within `request_timeout` seconds of its
  connection opening or of the previous response: otherwise 408 and the connection closed
  (a client that trickles bytes holds nothing for long); an idle one is closed silently.
- At most MAX_CONNECTIONS connections: past it, 503 with Retry-After, closed at once.
- What uvicorn answers by itself (a request h11 refuses) becomes TF Serving's JSON error:
  400, 414 (a request line past MAX_HEAD_BYTES) or 431 (headers past it).
- A client that half-closes after a whole request is answered, then closed.

The application tells each connection where its request stands (`Connections.of`, by the
client's address, which names one open TCP connection): started, read whole, answered.

uvicorn's internals used: its h11 protocol's class (`H11_PROTOCOL`) and that it writes to
the transport only responses; pinned in pyproject.toml, and the real-server tests of
tests/test_serving.py fail when they change.
"""

import asyncio
import http
import json

from uvicorn.protocols.http.h11_impl import H11Protocol as H11_PROTOCOL

# Connections open at once (past it: 503, then closed).
MAX_CONNECTIONS = 2048
# The request line and headers together (h11's own default); past it, 414 or 431.
MAX_HEAD_BYTES = 16 * 2**10
# What a 503 asks the client to wait, in seconds.
RETRY_AFTER_SECONDS = 1
# Where a connection's current request stands: waiting for (or receiving) its head, its
# body being read by the application, or read whole and being answered.
WAITING, READING, ANSWERING = "waiting", "reading", "answering"


def error_response(status, message):
    """TF Serving's JSON error as raw HTTP/1.1 bytes, closing the connection."""
    body = json.dumps({"error": message}).encode()
    head = (
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n"
    )
    if status == 503:
        head += f"retry-after: {RETRY_AFTER_SECONDS}\r\n"
    return (head + "\r\n").encode() + body


def refused_head(received):
    """The JSON error for a head that h11 refused, from the bytes received of it."""
    if len(received) >= MAX_HEAD_BYTES and b"\r\n" not in received:
        return error_response(414, f"The request line is too long: at most {MAX_HEAD_BYTES} bytes with the headers.")
    if len(received) >= MAX_HEAD_BYTES:
        return error_response(431, f"The request's headers are too large: at most {MAX_HEAD_BYTES} bytes.")
    return error_response(
        400,
        "Invalid HTTP request: it does not follow HTTP/1.1 (RFC 9112), for example a "
        "malformed request line or header, or a Content-Length that is not a number of bytes.",
    )


class Connections:
    """The open connections of one server, by their client's address.

    Args:
        request_timeout: seconds each request has to arrive whole.
        limit: the most connections open at once.
    """

    def __init__(self, request_timeout, limit=MAX_CONNECTIONS):
        self.request_timeout, self.limit = request_timeout, limit
        self.open = {}

    def protocol(self, **keywords):
        """A `Connection` for uvicorn to run; `keywords` are what uvicorn gives a protocol."""
        return Connection(self, keywords)

    def of(self, client):
        """The open connection of `client` (the ASGI scope's (host, port)), or None."""
        return self.open.get(tuple(client)) if client else None


class Connection(asyncio.Protocol):
    """One client connection: uvicorn's h11 protocol, with a deadline, a bound and JSON errors."""

    def __init__(self, connections, keywords):
        self.connections, self.keywords = connections, keywords
        self.inner = self.transport = self.deadline = self.client = None
        self.state, self.received, self.half_closed = WAITING, b"", False

    def connection_made(self, transport):
        self.transport = transport
        if len(self.connections.open) >= self.connections.limit:
            transport.write(
                error_response(
                    503,
                    f"The server is busy: {self.connections.limit} connections are "
                    f"open. Retry after {RETRY_AFTER_SECONDS} s.",
                )
            )
            transport.close()
            return
        self.client = tuple(transport.get_extra_info("peername")[:2])
        self.connections.open[self.client] = self
        self.inner = H11_PROTOCOL(**self.keywords)
        self.inner.connection_made(Transport(transport, self))
        self.start_deadline()

    def data_received(self, data):
        if self.inner is None:  # refused: closing
            return
        if self.state == WAITING and len(self.received) <= MAX_HEAD_BYTES:
            self.received += data[: MAX_HEAD_BYTES + 1 - len(self.received)]
        self.inner.data_received(data)

    def eof_received(self):
        """A client that half-closes after a whole request is answered, then closed; one that
        half-closes in the middle of a request has left (asyncio then closes the transport)."""
        if self.state == ANSWERING:
            self.half_closed = True
            return True
        return None

    def connection_lost(self, exc):
        if self.deadline is not None:
            self.deadline.cancel()
        if self.inner is not None:
            self.connections.open.pop(self.client, None)
            self.inner.connection_lost(exc)

    def pause_writing(self):
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self):
        if self.inner is not None:
            self.inner.resume_writing()

    # What the application tells it.

    def request_started(self):
        self.state = READING

    def request_read(self):
        self.state = ANSWERING
        if self.deadline is not None:
            self.deadline.cancel()

    def response_sent(self):
        self.state, self.received = WAITING, b""
        if self.half_closed:
            self.transport.close()
        elif not self.transport.is_closing():
            self.start_deadline()

    # The deadline.

    def start_deadline(self):
        if self.deadline is not None:
            self.deadline.cancel()
        self.deadline = asyncio.get_running_loop().call_later(self.connections.request_timeout, self.deadline_passed)

    def deadline_passed(self):
        if self.state == ANSWERING or self.transport.is_closing():
            return  # the request arrived whole; the network is answering it
        if self.state == WAITING and not self.received:
            self.transport.close()  # an idle connection: nothing to answer
            return
        self.transport.write(
            error_response(
                408,
                f"The request did not arrive whole within {self.connections.request_timeout:g} s (--request-timeout).",
            )
        )
        self.transport.close()


class Transport:
    """The transport uvicorn's protocol writes to: every call passes through, except what it
    writes while no request of the application is under way, which can only be its own
    answer to a request h11 refused: that becomes TF Serving's JSON error (`refused_head`)."""

    def __init__(self, transport, connection):
        self._transport, self._connection, self._replaced = transport, connection, False

    def write(self, data):
        if self._connection.state != WAITING:
            self._transport.write(data)
        elif not self._replaced:
            self._replaced = True
            self._transport.write(refused_head(self._connection.received))

    def __getattr__(self, name):
        return getattr(self._transport, name)
