"""The HTTP/1.1 connection layer (`serving.connections`) in-process, around a small ASGI application:
what it does with each kind of client, and that its count of open connections stays true."""

import asyncio
import json
import socket
import struct
import threading
import time

import pytest

from keras_preact_training.serving.connections import Connections


async def echo(scope, receive, send):
    """Answers the number of body bytes it read; "/slow" answers after 0.5 s."""
    received, more = 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        received, more = received + len(message["body"]), message["more_body"]
    if scope["path"] == "/slow":
        await asyncio.sleep(0.5)
    body = json.dumps({"bytes": received, "path": scope["path"]}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def server():
    """(connections, port, loop): `echo` served on a loop of its own thread, request timeout 2 s."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    connections = Connections(echo, request_timeout=2, limit=8)
    listening = asyncio.run_coroutine_threadsafe(loop.create_server(connections.protocol, "127.0.0.1", 0), loop).result(
        timeout=10
    )
    yield connections, listening.sockets[0].getsockname()[1], loop
    loop.call_soon_threadsafe(connections.abort)
    loop.call_soon_threadsafe(listening.close)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)


def exchange(port, data, half_close=False):
    """Sends `data` on a new connection and reads until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(data)
        if half_close:
            connection.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := connection.recv(65536):
            received += chunk
    return received


def open_count(connections, expected, within=5):
    """The number of open connections, once it is `expected` or `within` seconds have passed."""
    deadline = time.monotonic() + within
    while len(connections.open) != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return len(connections.open)


GET = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
CLOSING_GET = b"GET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def test_pipelined_requests_are_answered_in_order_on_one_connection(server):
    _, port, _ = server
    received = exchange(port, GET + b"POST /c HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc" + CLOSING_GET)
    answers = [json.loads(part.split(b"\r\n\r\n", 1)[1]) for part in received.split(b"HTTP/1.1 200 OK")[1:]]
    assert [answer["path"] for answer in answers] == ["/a", "/c", "/b"] and answers[1]["bytes"] == 3


def test_a_client_that_expects_100_continue_is_told_to_send_its_body(server):
    _, port, _ = server
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        assert connection.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        connection.sendall(b"abcd")
        answer = b""
        while b"}" not in answer:
            answer += connection.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and json.loads(answer.split(b"\r\n\r\n", 1)[1])["bytes"] == 4


def test_a_body_larger_than_the_read_buffer_arrives_whole(server):
    _, port, _ = server
    body = bytes(range(256)) * 4096  # 1 MiB: reading pauses and resumes many times
    answer = exchange(
        port, b"POST /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["bytes"] == len(body)


def test_the_count_of_open_connections_stays_true_whatever_the_client_does(server):
    """Clients that leave idle, in their head, in their body, reset, half-close, get a head
    refused, a 408, or are answered: afterwards no connection is counted open; one held
    open counts until it closes."""
    connections, port, _ = server
    held = socket.create_connection(("127.0.0.1", port), timeout=10)
    assert open_count(connections, 1) == 1
    held.close()
    assert open_count(connections, 0) == 0
    for data in [b"", b"POST /x HTTP/1.1\r\nHo", b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\nab"]:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as leaving:
            leaving.sendall(data)
    reset = socket.create_connection(("127.0.0.1", port), timeout=10)
    reset.sendall(b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab")
    reset.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    reset.close()
    assert exchange(port, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert exchange(port, b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\nab").startswith(b"HTTP/1.1 408 ")
    assert exchange(port, GET, half_close=True).startswith(b"HTTP/1.1 200 ")
    assert exchange(port, CLOSING_GET).startswith(b"HTTP/1.1 200 ")
    assert open_count(connections, 0) == 0


def test_past_the_bound_connections_are_refused_and_freed_slots_are_reused(server):
    connections, port, _ = server
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(connections.limit)]
    assert open_count(connections, connections.limit) == connections.limit
    refused = exchange(port, GET)
    assert refused.startswith(b"HTTP/1.1 503 ") and b"8 connections are open" in refused
    held.pop().close()
    assert open_count(connections, connections.limit - 1) == connections.limit - 1
    assert exchange(port, CLOSING_GET).startswith(b"HTTP/1.1 200 ")
    for connection in held:
        connection.close()
    assert open_count(connections, 0) == 0


def test_stopping_closes_idle_connections_and_answers_the_requests_under_way(server):
    connections, port, loop = server
    idle = socket.create_connection(("127.0.0.1", port), timeout=10)
    busy = socket.create_connection(("127.0.0.1", port), timeout=10)
    busy.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.2)
    loop.call_soon_threadsafe(connections.stop)
    assert idle.recv(65536) == b""
    received = b""
    while chunk := busy.recv(65536):
        received += chunk
    assert received.startswith(b"HTTP/1.1 200 ") and b"/slow" in received
    assert open_count(connections, 0) == 0
    idle.close()
    busy.close()
