"""The REST server under load and under attack, on 127.0.0.1.

    python bench/serving_load.py --models resnet20 resnet164 --clients 8 64 --requests 50

Prints the machine, then, for each model, a fresh `keras-preact serve` process on its
SavedModel (BatchNorm statistics of a batch, random weights: the speed does not depend on
them) and:
- load: `--clients` concurrent clients, each sending `--requests` single-image requests
  (one 32 x 32 JPEG, a different one per request) on its own kept-alive connection;
  requests/s, p50 and p95 latency, connection resets and other failures, 503s, and wrong
  answers (a class other than the one the same image gets alone);
- with `--attacks [NAME ...]` (first model only; all of them where none is named): 300 half-open connections (headers, then a body
  that never finishes) held open while 8 clients send 20 requests each (their p95), and
  how many of the 300 the server has closed 15 s later; 2 clients sending requests of four
  4096 x 4096 PNGs while 8 clients send 20 small requests each (their p50 and p95), and the
  same with 16 clients sending requests of one JPEG just under the large bound (`JUST_UNDER`),
  with 16 sending a 200 x 200 progressive JPEG (under the bound in pixels, past it in decoding
  cost), and with 2 sending four 4096 x 4096 GIF frames in one-byte sub-blocks a request;
  an image bomb (a 431 KB PNG of 20000 x 20000 pixels) and the seconds until it is refused;
  eight animated GIFs of a 64 x 64 frame and 16 frames of 4096 x 4096 in one request;
  four 57 MB bodies of 15 million numbers at once, while a probe client asks for the model's status every 10 ms
  (its slowest answer is how long the server stalled); the server's resident memory warm
  and after the attacks.

`--clients 1 8 64` measures one and eight kept-alive clients (each client keeps its
connection: before TCP_NODELAY, every response after a connection's first waited about
40 ms for a delayed ACK). `--runtimes tensorflow onnxruntime` serves each model with each
runtime in turn, one table.

The models are exported as SavedModel and ONNX, so `serve` picks its default runtime
(onnxruntime where installed); `--server-options='--runtime tensorflow'` chooses.
`--source DIR` serves with the code in DIR (another checkout: the before of a change);
`--server-options '--no-batching'` passes options to `serve`; `--no-fold` exports the
networks with BatchNorm as they train, not folded into the convolutions.
"""

import argparse
import base64
import concurrent.futures
import http.client
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf
from export_serving import CIFAR, exported
from harness import machine
from hostile_images import animated_gif_bomb, gif_of_one_byte_sub_blocks

HALF_OPEN_CONNECTIONS = 300
# Images just under the bounds of a large request: a full batch at CIFAR's size (64 x 32 x 32
# pixels, where a request counts as large now) and 1024 x 1024 pixels (where it counted as large
# before fairness counted pixels: many such requests took both network threads).
JUST_UNDER = ((255, 256), (1023, 1024))
# The targets of the onnxruntime server on an idle machine: seconds from process
# start to its first answer, and resident megabytes after the load for the zoo's ResNet-56.
FIRST_ANSWER_SECONDS = 2.0
RESIDENT_MEGABYTES = 200
IMAGES = 64  # different JPEGs the clients cycle through


def jpeg_bodies():
    pixels = np.random.default_rng(7).integers(0, 256, size=(IMAGES, *CIFAR.shape), dtype=np.uint8)
    return [
        json.dumps({"instances": [{"b64": base64.b64encode(tf.io.encode_jpeg(image).numpy()).decode()}]}).encode()
        for image in pixels
    ]


class Served:
    """`keras-preact serve` on a model folder, from `source`."""

    def __init__(self, model_dir, source, options=()):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        # The packages of `source` ahead of the installed ones: a benchmark of another tree, such as
        # main's, before and after a change.
        packages = os.path.abspath(source)
        started = time.perf_counter()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "keras_preact_training", "serve", model_dir, "--port", str(self.port), *options],
            env=dict(os.environ, PYTHONPATH=packages),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        line = self.process.stdout.readline()
        if not line.startswith("Serving"):
            raise RuntimeError(f"the server did not start: {line!r}")
        self.runtime = line.split(", ")[-1].split(")")[0]
        self.path = f"/v1/models/{os.path.basename(model_dir)}:predict"
        self.first_answer = self.time_to_first_answer(started)

    def time_to_first_answer(self, started):
        """Seconds from the process's start to its first answered request (one JPEG)."""
        body = jpeg_bodies()[0]
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        status = post(connection, self.path, body)[0]
        connection.close()
        if status != 200:
            raise RuntimeError(f"the server's first answer was HTTP {status}")
        return time.perf_counter() - started

    def resident_megabytes(self):
        with open(f"/proc/{self.process.pid}/status") as status:
            line = next(line for line in status if line.startswith("VmRSS:"))
        return int(line.split()[1]) / 1024

    def close(self):
        self.process.terminate()
        self.process.wait(timeout=60)


def post(connection, path, body):
    """Status, parsed answer and seconds of one request on a kept-alive connection."""
    started = time.perf_counter()
    connection.request("POST", path, body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    answer = json.loads(response.read())
    return response.status, answer, time.perf_counter() - started


def load(served, bodies, expected, clients, requests):
    """Every client on its own connection; failures counted, never raised."""

    def client(worker):
        connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=120)
        figures = dict(latencies=[], failures=0, unavailable=0, wrong=0)
        for request in range(requests):
            image = (worker * requests + request) % len(bodies)
            try:
                status, answer, seconds = post(connection, served.path, bodies[image])
            except (OSError, http.client.HTTPException, ValueError):
                figures["failures"] += 1
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=120)
                continue
            if status == 503:
                figures["unavailable"] += 1
            elif status != 200:
                figures["failures"] += 1
            else:
                figures["latencies"].append(seconds)
                figures["wrong"] += answer["predictions"][0]["class_ids"] != expected[image]
        connection.close()
        return figures

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(client, range(clients)))
    seconds = time.perf_counter() - started
    latencies = np.concatenate([result["latencies"] for result in results])
    return dict(
        rate=len(latencies) / seconds,
        p50=np.percentile(latencies, 50) if len(latencies) else float("nan"),
        p95=np.percentile(latencies, 95) if len(latencies) else float("nan"),
        failures=sum(result["failures"] for result in results),
        unavailable=sum(result["unavailable"] for result in results),
        wrong=sum(result["wrong"] for result in results),
    )


def half_open(served, bodies, expected):
    """300 connections that send headers and part of a body, then nothing."""
    held = []
    for _ in range(HALF_OPEN_CONNECTIONS):
        connection = socket.create_connection(("127.0.0.1", served.port), timeout=30)
        connection.sendall(f"POST {served.path} HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{{".encode())
        held.append(connection)
    normal = load(served, bodies, expected, clients=8, requests=20)
    time.sleep(15)
    closed = 0
    for connection in held:
        connection.setblocking(False)
        try:
            while connection.recv(65536):  # a timeout answer, then the close
                pass
            closed += 1
        except BlockingIOError:
            pass  # still open, nothing sent
        except OSError:
            closed += 1
        connection.close()
    return normal, closed


def bomb():
    """A PNG of 20000 x 20000 black pixels: 431 KB encoded, 1.2 GB decoded as RGB."""
    from PIL import Image

    encoded = io.BytesIO()
    Image.new("L", (20000, 20000)).save(encoded, format="PNG")
    return json.dumps({"instances": [{"b64": base64.b64encode(encoded.getvalue()).decode()}]}).encode()


def large_bodies(served, bodies=4):
    """`bodies` 57 MB bodies of 15 million numbers posted at once while a probe asks for the
    model's status every 10 ms: (their statuses, seconds until all were answered, the probe's
    slowest answer in seconds)."""
    body = b'{"signature_name": "predict_normalized", "instances": [' + b"0.1," * 14_250_000 + b"0.1]}"
    status_path = served.path.rsplit(":", 1)[0]
    done, slowest = [], [0.0]

    def probe():
        connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=120)
        while not done:
            started = time.perf_counter()
            connection.request("GET", status_path)
            connection.getresponse().read()
            slowest[0] = max(slowest[0], time.perf_counter() - started)
            time.sleep(0.01)
        connection.close()

    def send(_):
        connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=300)
        connection.request("POST", served.path, body, {"Content-Type": "application/json"})
        status = connection.getresponse().status
        connection.close()
        return status

    prober = concurrent.futures.ThreadPoolExecutor(1)
    probing = prober.submit(probe)
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(bodies) as pool:
        statuses = list(pool.map(send, range(bodies)))
    seconds = time.perf_counter() - started
    done.append(True)
    probing.result()
    prober.shutdown()
    return statuses, seconds, slowest[0]


def large_images(served, bodies, expected, clients=2, requests=4):
    """`clients` clients each sending `requests` requests of four 4096 x 4096 PNGs (the most
    pixels a request may decode), while 8 clients send 20 small requests each: (the small
    ones' figures, the large ones' statuses)."""
    from PIL import Image

    encoded = io.BytesIO()
    Image.linear_gradient("L").resize((4096, 4096)).convert("RGB").save(encoded, format="PNG")
    body = json.dumps({"instances": [{"b64": base64.b64encode(encoded.getvalue()).decode()}] * 4}).encode()

    def send(_):
        connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=300)
        statuses = [post(connection, served.path, body)[0] for _ in range(requests)]
        connection.close()
        return statuses

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        large = pool.map(send, range(clients))
        time.sleep(0.5)  # the large ones decoding
        normal = load(served, bodies, expected, clients=8, requests=20)
        statuses = sorted(status for client in large for status in client)
    return normal, statuses


def just_under(served, bodies, expected, height, width, clients=16, progressive=False):
    """`clients` clients each sending, for as long as 8 clients send 20 small requests each,
    requests of one `height` x `width` JPEG: (the small ones' figures, theirs answered)."""
    pixels = np.random.default_rng(11).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    image = tf.io.encode_jpeg(pixels, quality=90, progressive=progressive).numpy()
    return looping(served, bodies, expected, json.dumps({"instances": [{"b64": b64(image)}]}).encode(), clients)


def b64(encoded):
    return base64.b64encode(encoded).decode()


def looping(served, bodies, expected, body, clients):
    """`clients` clients each sending `body` again and again, for as long as 8 clients send 20
    small requests each: (the small ones' figures, theirs answered)."""
    done = threading.Event()

    def send(_):
        connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=300)
        answered = 0
        while not done.is_set():
            answered += post(connection, served.path, body)[0] == 200
        connection.close()
        return answered

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        under = pool.map(send, range(clients))
        time.sleep(0.5)  # theirs queued
        normal = load(served, bodies, expected, clients=8, requests=20)
        done.set()
        answered = sum(under)
    return normal, answered


def gif_bombs():
    """Eight animated GIFs of a 64 x 64 first frame and 16 frames of 4096 x 4096 (212 KB each)."""
    return json.dumps({"instances": [{"b64": base64.b64encode(animated_gif_bomb()).decode()}] * 8}).encode()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet20", "resnet164"])
    parser.add_argument("--clients", nargs="+", type=int, default=[8, 64])
    parser.add_argument("--requests", type=int, default=50, help="requests per client")
    parser.add_argument(
        "--attacks",
        nargs="*",
        choices=sorted(ATTACKS),
        help="the attacks, all where none is named (first model only)",
    )
    parser.add_argument(
        "--source",
        default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        help="the checkout whose server runs (default: this one)",
    )
    parser.add_argument("--server-options", default="", help="more options of `serve`, e.g. '--no-batching'")
    parser.add_argument(
        "--runtimes",
        nargs="+",
        default=["auto"],
        choices=["auto", "tensorflow", "onnxruntime"],
        help="serve each model with each of these runtimes in turn (default: serve's own choice)",
    )
    parser.add_argument("--no-fold", dest="fold", action="store_false", help="export without folding BatchNorm")
    arguments = parser.parse_args()
    print(
        f"machine: {machine()}; server code: {arguments.source} {arguments.server_options}; "
        f"BatchNorm {'folded' if arguments.fold else 'not folded'}"
    )
    bodies = jpeg_bodies()
    print(
        "| model | runtime | first answer s | clients x requests | requests/s | p50 ms | p95 ms | resets/failures | "
        "503 | wrong | resident MB after |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as directory:
        for index, name in enumerate(arguments.models):
            path, _ = exported(name, directory, formats=("saved_model", "onnx"), fold_batch_norms=arguments.fold)
            for runtime in arguments.runtimes:
                attacks = [] if index or arguments.attacks is None else arguments.attacks or list(ATTACKS)
                serve_model(name, runtime, attacks, os.path.dirname(path), bodies, arguments)


def serve_model(name, runtime, attacks, model_dir, bodies, arguments):
    """The load, then the `attacks` (names of ATTACKS), against one server of `model_dir`."""
    options = arguments.server_options.split() + ([] if runtime == "auto" else ["--runtime", runtime])
    served = Served(model_dir, arguments.source, options)
    try:
        connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=120)
        expected = [post(connection, served.path, body)[1]["predictions"][0]["class_ids"] for body in bodies]
        connection.close()
        warm = served.resident_megabytes()
        for clients in arguments.clients:
            figures = load(served, bodies, expected, clients, arguments.requests)
            print(
                f"| {name} | {served.runtime} | {served.first_answer:.2f} | {clients} x {arguments.requests} | "
                f"{figures['rate']:.1f} | {1000 * figures['p50']:.0f} | {1000 * figures['p95']:.0f} | "
                f"{figures['failures']} | {figures['unavailable']} | {figures['wrong']} | "
                f"{served.resident_megabytes():.0f} |",
                flush=True,
            )
        if served.runtime == "onnxruntime":
            resident = served.resident_megabytes()
            print(
                f"{name}: onnxruntime targets: first answer {served.first_answer:.2f} s (<= {FIRST_ANSWER_SECONDS:g} "
                f"s: {'met' if served.first_answer <= FIRST_ANSWER_SECONDS else 'missed'}); resident after the load "
                f"{resident:.0f} MB (<= {RESIDENT_MEGABYTES} MB for resnet56: "
                f"{'met' if resident <= RESIDENT_MEGABYTES else 'missed'})",
                flush=True,
            )
        for attack in attacks:
            ATTACKS[attack](name, served, bodies, expected)
        if attacks:
            print(
                f"{name}: resident memory warm {warm:.0f} MB, after the attacks {served.resident_megabytes():.0f} MB",
                flush=True,
            )
    finally:
        served.close()


def attack_half_open(name, served, bodies, expected):
    normal, closed = half_open(served, bodies, expected)
    print(
        f"{name}: {HALF_OPEN_CONNECTIONS} half-open connections held: 8 clients x 20 requests "
        f"p95 {1000 * normal['p95']:.0f} ms, {normal['failures']} failures; {closed} of "
        f"{HALF_OPEN_CONNECTIONS} closed by the server 15 s later",
        flush=True,
    )


def attack_large_images(name, served, bodies, expected):
    normal, statuses = large_images(served, bodies, expected)
    print(
        f"{name}: 2 clients sending four 4096 x 4096 PNGs a request: 8 clients x 20 small requests "
        f"meanwhile p50 {1000 * normal['p50']:.0f} ms, p95 {1000 * normal['p95']:.0f} ms, "
        f"{normal['failures']} failures; the large ones {statuses}",
        flush=True,
    )


def attack_progressive(name, served, bodies, expected):
    normal, answered = just_under(served, bodies, expected, 200, 200, progressive=True)
    print(
        f"{name}: 16 clients sending one 200 x 200 progressive JPEG (10 scans: 40,000 pixels, decoding 400,000) "
        f"a request: 8 clients x 20 small requests meanwhile p50 {1000 * normal['p50']:.0f} ms, p95 "
        f"{1000 * normal['p95']:.0f} ms, {normal['failures']} failures; {answered} of theirs answered",
        flush=True,
    )


def attack_gif_sub_blocks(name, served, bodies, expected):
    """Two clients sending four GIFs a request, each a 4096 x 4096 frame in one-byte sub-blocks,
    as many as a frame of its pixels may have (MAX_GIF_SUB_BLOCKS): the most walking a request's
    sub-blocks can cost."""
    from keras_preact_training.serving import image_formats

    gif = gif_of_one_byte_sub_blocks(image_formats.MAX_GIF_SUB_BLOCKS, side=4096)
    body = json.dumps({"instances": [{"b64": b64(gif)}] * 4}).encode()
    before = served.resident_megabytes()
    normal, answered = looping(served, bodies, expected, body, clients=2)
    print(
        f"{name}: 2 clients sending four 4096 x 4096 GIF frames of {image_formats.MAX_GIF_SUB_BLOCKS:,} one-byte "
        f"sub-blocks a request ({len(body) / 2**20:.1f} MB): 8 clients x 20 small requests meanwhile p50 "
        f"{1000 * normal['p50']:.0f} ms, p95 {1000 * normal['p95']:.0f} ms, {normal['failures']} failures; "
        f"{answered} of theirs answered; resident {before:.0f} -> {served.resident_megabytes():.0f} MB",
        flush=True,
    )


def attack_just_under(name, served, bodies, expected):
    for height, width in JUST_UNDER:
        normal, answered = just_under(served, bodies, expected, height, width)
        print(
            f"{name}: 16 clients sending one {width} x {height} JPEG a request ({height * width:,} pixels): 8 "
            f"clients x 20 small requests meanwhile p50 {1000 * normal['p50']:.0f} ms, p95 "
            f"{1000 * normal['p95']:.0f} ms, {normal['failures']} failures; {answered} of theirs answered",
            flush=True,
        )


def post_alone(served, body):
    """Status, parsed answer and seconds of one request on a connection of its own."""
    connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=300)
    try:
        return post(connection, served.path, body)
    finally:
        connection.close()


def attack_bomb(name, served, bodies, expected):
    status, answer, seconds = post_alone(served, bomb())
    print(
        f"{name}: image bomb (20000 x 20000 PNG): HTTP {status} in {1000 * seconds:.0f} ms: {str(answer)[:120]}",
        flush=True,
    )


def attack_gifs(name, served, bodies, expected):
    status, _, seconds = post_alone(served, gif_bombs())
    print(
        f"{name}: 8 animated GIFs (64 x 64, then 16 frames of 4096 x 4096): HTTP {status} in {1000 * seconds:.0f} ms",
        flush=True,
    )


def attack_large_bodies(name, served, bodies, expected):
    statuses, seconds, slowest = large_bodies(served)
    print(
        f"{name}: four 57 MB bodies of 15 million numbers at once: HTTP {statuses} in {seconds:.2f} s; "
        f"the probe's slowest answer meanwhile {1000 * slowest:.0f} ms",
        flush=True,
    )


ATTACKS = {
    "half_open": attack_half_open,
    "large_images": attack_large_images,
    "just_under": attack_just_under,
    "progressive": attack_progressive,
    "gif_sub_blocks": attack_gif_sub_blocks,
    "bomb": attack_bomb,
    "gifs": attack_gifs,
    "large_bodies": attack_large_bodies,
}


if __name__ == "__main__":
    main()
