"""Three well-kept ASGI servers against the hostile clients of the serving tests, on 127.0.0.1.

    python bench/http_servers.py --servers hypercorn uvicorn granian

Each server runs in a process of its own, serving one Starlette application (GET /small: a
short JSON answer; GET /big: 64 KiB; GET /slow: answered after 2 s; POST /echo: the body's
length), configured alike through its public settings: 5 s to send a request's head or to
stay idle, 5 s a read; on uvloop's event loop where it is installed (uvicorn chooses it
itself; Granian has its own). Then, one after the other, while a probe client asks for /small every
50 ms (its slowest answer is how long the attack stalled the others):

- trickled head: 50 connections each sending a request head a byte a second;
- trickled body: 50 POSTs whose 1,000-byte bodies come a byte a second;
- idle: 50 connections that send nothing;
  (for these three: how many connections the server closed by 15 s, and when)
- never reading: 4 connections each pipelining 2,000 GET /big and reading nothing: the
  server's resident memory 15 s later and after the clients leave;
- flood: 1,000 connections opened at once and left: the seconds until a new client is
  answered once they are closed;
- SIGTERM while a GET /slow is in flight: whether it is answered, and the seconds until the
  process has exited;
- throughput: 8 clients, each on its own kept-alive connection, GET /small for 5 s.
"""

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from harness import processor

TIMEOUT = 5
ATTACKERS = 50
WINDOW = 15

APPLICATION = """
import asyncio
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

async def small(request):
    return JSONResponse({"model_version_status": [{"version": "1", "state": "AVAILABLE"}]})

async def big(request):
    return Response(b"x" * 65536)

async def slow(request):
    await asyncio.sleep(2)
    return JSONResponse({"slow": True})

async def echo(request):
    return JSONResponse({"length": len(await request.body())})

app = Starlette(routes=[Route("/small", small), Route("/big", big), Route("/slow", slow),
                        Route("/echo", echo, methods=["POST"])])
"""

SERVERS = {
    "hypercorn": (
        "import asyncio, signal, hypercorn.asyncio, hypercorn.config\n"
        "from application import app\n"
        "config = hypercorn.config.Config()\n"
        "config.bind = ['127.0.0.1:{port}']\n"
        "config.keep_alive_timeout = config.read_timeout = {timeout}\n"
        "config.graceful_timeout = {timeout}\n"
        "config.accesslog = None\n"
        "async def main():\n"
        "    stop = asyncio.Event()\n"
        "    loop = asyncio.get_running_loop()\n"
        "    for number in (signal.SIGINT, signal.SIGTERM):\n"
        "        loop.add_signal_handler(number, stop.set)\n"
        "    await hypercorn.asyncio.serve(app, config, shutdown_trigger=stop.wait)\n"
        "try:\n"
        "    import uvloop\n"
        "    uvloop.run(main())\n"
        "except ImportError:\n"
        "    asyncio.run(main())\n"
    ),
    "uvicorn": (
        "import uvicorn\n"
        "from application import app\n"
        "uvicorn.run(app, host='127.0.0.1', port={port}, http='h11', timeout_keep_alive={timeout},\n"
        "            timeout_graceful_shutdown={timeout}, access_log=False, log_level='warning')\n"
    ),
    "granian": (
        "from granian import Granian\n"
        "from granian.constants import Interfaces\n"
        "from granian.http import HTTP1Settings\n"
        "Granian('application:app', address='127.0.0.1', port={port}, interface=Interfaces.ASGI, workers=1,\n"
        "        http1_settings=HTTP1Settings(header_read_timeout={timeout} * 1000),\n"
        "        workers_kill_timeout={timeout}, log_enabled=False).serve()\n"
    ),
}


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(name, folder):
    port = free_port()
    with open(os.path.join(folder, "application.py"), "w") as file:
        file.write(APPLICATION)
    process = subprocess.Popen(
        [sys.executable, "-c", SERVERS[name].format(port=port, timeout=TIMEOUT)],
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            get(port, "/small")
            return process, port
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{name} did not answer on port {port} within 30 s")


def get(port, path, timeout=10.0):
    """One GET on a new connection: the seconds it took."""
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        connection.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    if not answer.startswith(b"HTTP/1.1 200"):
        raise OSError(f"answer {answer[:40]!r}")
    return time.perf_counter() - started


class Probe:
    """A client asking for /small every 50 ms: its slowest answer and its failures."""

    def __init__(self, port):
        self.port, self.slowest, self.failures, self.running = port, 0.0, 0, True
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        while self.running:
            try:
                self.slowest = max(self.slowest, get(self.port, "/small"))
            except OSError:
                self.failures += 1
            time.sleep(0.05)

    def stop(self):
        self.running = False
        self.thread.join()
        return f"probe slowest {self.slowest:.2f} s, {self.failures} failed"


def resident_mebibytes(pid):
    """The resident memory of `pid` and its children (Granian's workers), MiB."""
    total = 0
    for process in [str(pid), *children(pid)]:
        try:
            with open(f"/proc/{process}/status") as status:
                total += next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
        except (OSError, StopIteration):
            pass
    return total / 1024


def children(pid):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found += [entry, *children(int(entry))]
            except OSError:
                pass
    return found


def slow_clients(port, opening, trickle):
    """ATTACKERS connections sending `opening`, then `trickle` a byte a second; when the
    server closed each (None: still open after WINDOW seconds)."""
    connections = []
    for _ in range(ATTACKERS):
        connection = socket.create_connection(("127.0.0.1", port))
        connection.sendall(opening)
        connection.setblocking(False)
        connections.append(connection)
    started, closed = time.time(), [None] * ATTACKERS
    position = 0
    while time.time() - started < WINDOW and None in closed:
        for index, connection in enumerate(connections):
            if closed[index] is not None:
                continue
            try:
                if connection.recv(65536) == b"":
                    closed[index] = time.time() - started
                    continue
            except BlockingIOError:
                pass
            except OSError:
                closed[index] = time.time() - started
                continue
            if trickle:
                try:
                    connection.send(trickle[position % len(trickle) : position % len(trickle) + 1])
                except OSError:
                    closed[index] = time.time() - started
        position += 1
        time.sleep(1.0 if trickle else 0.1)
    for connection in connections:
        connection.close()
    times = [seconds for seconds in closed if seconds is not None]
    return f"{len(times)}/{ATTACKERS} closed" + (f" by {max(times):.1f} s" if times else "")


def never_reading(port, pid):
    """4 connections pipelining 2,000 GET /big each, never reading."""
    before = resident_mebibytes(pid)
    request = b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n" * 2000
    connections = []
    for _ in range(4):
        connection = socket.create_connection(("127.0.0.1", port))
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        connection.settimeout(2)
        with contextlib.suppress(OSError):
            connection.sendall(request)
        connections.append(connection)
    time.sleep(WINDOW)
    during = resident_mebibytes(pid)
    for connection in connections:
        connection.close()
    time.sleep(3)
    return f"resident {before:.0f} -> {during:.0f} MiB, {resident_mebibytes(pid):.0f} after they left"


def flood(port):
    connections = []
    for _ in range(1000):
        try:
            connection = socket.socket()
            connection.setblocking(False)
            connection.connect_ex(("127.0.0.1", port))
            connections.append(connection)
        except OSError:
            break
    time.sleep(3)
    for connection in connections:
        connection.close()
    started = time.perf_counter()
    while True:
        try:
            get(port, "/small", timeout=2)
            return f"{len(connections)} connections; answered {time.perf_counter() - started:.2f} s after"
        except OSError:
            if time.perf_counter() - started > 60:
                return f"{len(connections)} connections; no answer within 60 s"


def terminated(process, port):
    """SIGTERM while a GET /slow is in flight."""
    answer = {}

    def slow():
        try:
            answer["seconds"] = get(port, "/slow")
        except OSError as error:
            answer["error"] = str(error)[:60]

    thread = threading.Thread(target=slow)
    thread.start()
    time.sleep(0.5)
    started = time.perf_counter()
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)
    exited = time.perf_counter() - started
    thread.join()
    kept = "answered" if "seconds" in answer else f"not answered ({answer.get('error')})"
    return f"in-flight request {kept}; exited {exited:.1f} s after SIGTERM"


def throughput(port, clients=8, seconds=5.0):
    """Requests/s of `clients` clients, each on a kept-alive connection (opened again where the
    server closes it: Hypercorn does after 1,000 requests)."""
    counts, reconnections = [0] * clients, [0] * clients

    def client(index):
        deadline = time.time() + seconds
        while time.time() < deadline:
            with socket.create_connection(("127.0.0.1", port)) as connection:
                connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                reader = connection.makefile("rb")
                while time.time() < deadline:
                    try:
                        connection.sendall(b"GET /small HTTP/1.1\r\nHost: x\r\n\r\n")
                        length, closing = None, False
                        while (line := reader.readline()) not in (b"\r\n", b""):
                            if line.lower().startswith(b"content-length:"):
                                length = int(line.split(b":")[1])
                            closing |= line.lower().strip() == b"connection: close"
                        if length is None:
                            break
                        reader.read(length)
                        counts[index] += 1
                        if closing:
                            break
                    except OSError:
                        break
                reconnections[index] += 1

    threads = [threading.Thread(target=client, args=(index,)) for index in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return f"{sum(counts) / seconds:.0f} requests/s ({clients} kept-alive clients, {sum(reconnections)} connections)"


def measure(name, folder):
    process, port = start(name, folder)
    print(f"\n{name}", flush=True)
    try:
        print(f"  throughput:    {throughput(port)}", flush=True)
        attacks = {
            "trickled head": lambda: slow_clients(port, b"GET /small HTTP/1.1\r\n", b"X-Slow: aaaaaaaa\r\n"),
            "trickled body": lambda: slow_clients(
                port, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n", b"a"
            ),
            "idle": lambda: slow_clients(port, b"", b""),
            "never reading": lambda: never_reading(port, process.pid),
            "flood": lambda: flood(port),
        }
        for attack, run in attacks.items():
            probe = Probe(port)
            result = run()
            print(f"  {attack + ':':14} {result}; {probe.stop()}", flush=True)
        print(f"  SIGTERM:       {terminated(process, port)}", flush=True)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", nargs="+", choices=sorted(SERVERS), default=sorted(SERVERS))
    arguments = parser.parse_args()
    print(f"{processor()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    import importlib.metadata
    import tempfile

    print(", ".join(f"{name} {importlib.metadata.version(name)}" for name in arguments.servers))
    with tempfile.TemporaryDirectory() as folder:
        for name in arguments.servers:
            measure(name, folder)


if __name__ == "__main__":
    main()
