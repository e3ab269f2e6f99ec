"""The second hostile-input battery against `keras-preact serve`: batching that never
loses a request, TCP_NODELAY, animated and 1-channel images, large bodies, HTTP framing, and
the files a server or a resumed run must not trust."""

import asyncio
import concurrent.futures
import http.client
import http.server
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from importlib.metadata import version as importlib_version

import numpy as np
import onnx
import pytest
import tensorflow as tf
from PIL import Image
from starlette.requests import ClientDisconnect, Request

import keras_preact
from bench.hostile_images import animated_gif_bomb, gif_of_one_byte_sub_blocks, gif_parts
from keras_preact import pretrained
from keras_preact_training import export
from keras_preact_training.data import input_tensorflow
from keras_preact_training.export import contract, saved_model
from keras_preact_training.serving import client as query_client
from keras_preact_training.serving import image_formats, protocol
from keras_preact_training.serving.application import ServingAPI
from keras_preact_training.serving.batching import Batcher
from keras_preact_training.serving.model import RUNTIMES, ModelServer
from keras_preact_training.serving.protocol import UNDECODABLE, Parsed
from keras_preact_training.serving.server import listening_socket
from tests.conftest import KERAS_PREACT
from tests.test_export import CIFAR, calibrated, random_pixels
from tests.test_serving import (
    PREDICT,
    Client,
    b64,
    export_resnet20,
    free_port,
    jpegs,
    raw_exchange,
    serve_command,
    start_server,
    stop_server,
)

pytestmark = pytest.mark.tensorflow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_BATCH = 64
PATH = "/v1/models/cifar10_resnet20:predict"
# Batched and single answers: float32 rounding of one call over another batch size.
BATCHING_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A calibrated ResNet-20 in <tmp>/cifar10_resnet20/1, SavedModel and ONNX: its folder."""
    return export_resnet20(tmp_path_factory, seed=5)[2]


@pytest.fixture(scope="module", params=tuple(RUNTIMES))
def served(exported, request):
    """`exported` served with each runtime, batching on, 64 instances a request at most."""
    server, port = start_server(exported, "--max-batch", str(MAX_BATCH), "--runtime", request.param)
    yield Client(f"http://127.0.0.1:{port}"), port, server
    stop_server(server)


# 1. Batching never loses a request or a slot ---------------------------------------------


class BlockingModel:
    """A stand-in for ModelServer whose first `blocked` calls wait for `release`."""

    max_batch = MAX_BATCH
    image_pixels = CIFAR.image_size**2

    def __init__(self, blocked=2, answers=None):
        self.release, self.calls, self.blocked = threading.Event(), [], blocked
        self.answers = answers

    def infer(self, requests):
        self.calls.append([len(request) for request in requests])
        if len(self.calls) <= self.blocked:
            assert self.release.wait(timeout=60)
        if self.answers is not None:
            return self.answers(requests)
        return [float(np.sum(request.values)) for request in requests]


def run_batcher(model, requests, threads=2):
    async def run():
        batcher = Batcher(model, threads=threads)
        answers = [asyncio.ensure_future(batcher.infer(request)) for request in requests]
        await asyncio.sleep(0.2)  # the first two run (blocked), the others wait
        model.release.set()
        results = await asyncio.wait_for(asyncio.gather(*answers, return_exceptions=True), timeout=60)
        return results, batcher.idle_threads

    return asyncio.run(run())


def pixel_request(instances, value):
    return Parsed("predict_pixels", "pixels", np.full((instances, *CIFAR.shape), value, np.uint8), True)


def test_waiting_pixel_requests_are_batched_and_all_answered():
    """The battery's reproduction: both threads busy, then pixel requests of 60, 10 and 1
    instances wait (NumPy arrays, which `deque.remove` compared and failed on): the next call
    takes 60 and 1 (60 + 10 > 64), the one after it 10; every one is answered, both threads
    come back."""
    model = BlockingModel()
    requests = [
        pixel_request(1, 1),
        pixel_request(1, 2),
        pixel_request(60, 3),
        pixel_request(10, 4),
        pixel_request(1, 5),
    ]
    results, idle = run_batcher(model, requests)
    assert results == [float(np.sum(request.values)) for request in requests]
    assert model.calls == [[1], [1], [60, 1], [10]] and idle == 2


# The most pixels of a small request to BlockingModel: a full batch of CIFAR images.
LARGE_PIXELS = MAX_BATCH * CIFAR.image_size**2


def test_large_requests_leave_a_thread_for_the_others():
    """A large request (its images decode to more pixels than a full batch at the network's
    size) holds a thread as long as its decoding takes (here: until released); a second one
    waits for it, while the small requests behind them are answered, one after the other, on
    the other thread."""
    model = BlockingModel(blocked=1)
    large = [Parsed("serving_default", "images", np.full((1, 1), value), True, LARGE_PIXELS + 1) for value in (1, 2)]
    small = [Parsed("serving_default", "images", np.full((1, 1), value), True, 32 * 32) for value in (3, 4)]

    async def run():
        batcher = Batcher(model, threads=2)
        answers = [asyncio.ensure_future(batcher.infer(request)) for request in [*large, *small]]
        done, _ = await asyncio.wait(answers[2:], timeout=30)
        assert len(done) == 2 and not answers[1].done()  # the second large request still waits
        model.release.set()
        return await asyncio.wait_for(asyncio.gather(*answers), timeout=60), batcher.idle_threads

    results, idle = asyncio.run(run())
    assert results == [1.0, 2.0, 3.0, 4.0] and model.calls == [[1]] * 4 and idle == 2


def test_many_requests_just_under_the_large_bound_are_large_work_together():
    """Requests each just under the bound are small, but batched they would decode as much as a
    large one: a batch of small requests stays within the bound, so that each call on the
    thread kept for small requests decodes as little as one of them."""
    model = BlockingModel(blocked=2)
    busy = [Parsed("serving_default", "images", np.full((1, 1), value), True, 32 * 32) for value in (1, 2)]
    under = [Parsed("serving_default", "images", np.full((1, 1), value), True, LARGE_PIXELS - 1) for value in (3, 4, 5)]
    tiny = [Parsed("serving_default", "images", np.full((1, 1), value), True, 32 * 32) for value in (6, 7)]
    results, idle = run_batcher(model, [*busy, *under, *tiny])
    assert results == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0] and idle == 2
    assert all(len(call) == 1 for call in model.calls[2:5])  # each request just under the bound alone
    assert model.calls[-1] == [1, 1]  # the small ones together


def test_a_progressive_jpegs_cost_counts_its_scans():
    """A request's decoding cost is its pixels once a pass: a 100 x 100 progressive JPEG of
    libjpeg's 10 scans costs 100,000 pixels, large for CIFAR (past 65,536) where the same
    image in one scan costs 10,000; a PNG, a GIF and a BMP cost their pixels."""
    pixels = np.random.default_rng(3).integers(0, 256, (100, 100, 3), dtype=np.uint8)
    costs = {}
    for name, options in (("baseline", {}), ("progressive", {"progressive": True})):
        encoded = io.BytesIO()
        Image.fromarray(pixels).save(encoded, format="JPEG", quality=90, **options)
        costs[name] = protocol.checked_images([encoded.getvalue()], "images", 3)[1]
    for image_format in ("PNG", "GIF", "BMP"):
        costs[image_format] = protocol.checked_images([encoded_image(pixels, image_format)], "images", 3)[1]
    assert costs == {"baseline": 10_000, "progressive": 100_000, "PNG": 10_000, "GIF": 10_000, "BMP": 10_000}
    assert costs["baseline"] <= LARGE_PIXELS < costs["progressive"]


class Unmeasurable(Parsed):
    """A request whose size cannot be read: batch assembly fails on it."""

    def __len__(self):
        raise RuntimeError("no size")


def test_a_failure_while_assembling_a_batch_answers_that_request_and_frees_the_slot():
    model = BlockingModel()
    bad = Unmeasurable("predict_pixels", "pixels", np.zeros((1, *CIFAR.shape), np.uint8), True)
    requests = [pixel_request(1, 1), pixel_request(1, 2), pixel_request(2, 3), bad, pixel_request(3, 4)]
    results, idle = run_batcher(model, requests)
    assert results[:3] == [float(np.sum(request.values)) for request in requests[:3]]
    assert isinstance(results[3], RuntimeError) and str(results[3]) == "no size"
    assert results[4] == float(np.sum(requests[4].values)) and idle == 2


def test_a_network_that_answers_too_few_requests_fails_the_batch_and_frees_the_slot():
    model = BlockingModel(answers=lambda requests: ["one answer"])
    results, idle = run_batcher(
        model, [pixel_request(1, 1), pixel_request(1, 2), pixel_request(2, 3), pixel_request(2, 4)]
    )
    assert results[:2] == ["one answer", "one answer"]
    assert (
        all(
            isinstance(result, RuntimeError) and "answered 1 of the batch's 2 requests" in str(result)
            for result in results[2:]
        )
        and idle == 2
    )


def summed(requests):
    return [{"sum": np.array([float(np.sum(request.values))])} for request in requests]


def fake_request(body, leaves=None):
    """A Starlette request for `:predict` whose body is `body`; its client leaves
    ("http.disconnect") once the event `leaves` is set, or never."""
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        if messages:
            return messages.pop()
        await (leaves or asyncio.Event()).wait()
        return {"type": "http.disconnect"}

    scope = {"type": "http", "method": "POST", "headers": [], "path_params": {"name": "blocking"}}
    return Request(scope, receive)


def test_a_request_whose_client_has_gone_leaves_the_queue_unrun():
    """Both inference threads busy, two requests wait; the client of the first leaves: its
    request is answered ClientDisconnect at once and never reaches the network, the other is
    run, and the in-flight count and the bodies' bytes come back to 0."""
    model = BlockingModel(answers=summed)
    model.name, model.check_version = "blocking", lambda version: None
    model.parse = lambda body: pixel_request(1, int(body))
    model.check_decoding = lambda parsed: None
    api = ServingAPI(model)

    async def run():
        leaves = asyncio.Event()
        busy = [asyncio.ensure_future(api.predict(fake_request(body))) for body in (b"1", b"2")]
        await asyncio.sleep(0.3)  # both threads blocked
        gone = asyncio.ensure_future(api.predict(fake_request(b"3", leaves)))
        stays = asyncio.ensure_future(api.predict(fake_request(b"4")))
        await asyncio.sleep(0.3)
        assert api.in_flight == 4 and api.body_bytes == 4
        leaves.set()
        with pytest.raises(ClientDisconnect):
            await asyncio.wait_for(gone, timeout=10)
        model.release.set()
        answers = await asyncio.wait_for(asyncio.gather(*busy, stays), timeout=60)
        return [json.loads(answer.body)["predictions"][0]["sum"] for answer in answers]

    assert asyncio.run(run()) == [float(np.sum(pixel_request(1, value).values)) for value in (1, 2, 4)]
    assert model.calls == [[1], [1], [1]] and api.in_flight == 0 and api.body_bytes == 0


def soak_pool(count=24):
    """`count` images in each signature's form: JPEG bytes, their decoded pixels, normalised."""
    encoded = jpegs(random_pixels(count, CIFAR, seed=11))
    pixels = np.stack([input_tensorflow.decode_image(image, 3).numpy() for image in encoded])
    normalized = (pixels - np.array(CIFAR.normalization_mean)) / np.array(CIFAR.normalization_std)
    return {
        "serving_default": [b64(image) for image in encoded],
        "predict_pixels": pixels.tolist(),
        "predict_normalized": normalized.astype(np.float32).tolist(),
    }


def invalid_instance(signature):
    return {
        "serving_default": b64(b"\xff\xd8\xff not a whole JPEG"),
        "predict_pixels": np.full(CIFAR.shape, 300).tolist(),
        "predict_normalized": np.zeros((16, 32, 3)).tolist(),
    }[signature]


def soak(client, clients, requests_per_client):
    """`clients` clients at once, each sending `requests_per_client` requests of 1-60
    instances in all three signatures, one in seven with an invalid instance. Returns the
    statuses, and the largest difference of a batched answer from the single answer."""
    pool, signatures = soak_pool(), list(contract.SIGNATURES)
    single = {}
    for signature in signatures:
        for row, instance in enumerate(pool[signature]):
            status, answer = client.post(PATH, {"signature_name": signature, "instances": [instance]})
            assert status == 200, answer
            single[signature, row] = np.array(answer["predictions"][0]["probabilities"])

    def worker(index):
        rng = np.random.default_rng(index)
        statuses, largest = [], 0.0
        for request in range(requests_per_client):
            signature = signatures[(index + request) % 3]
            rows = rng.integers(0, len(pool[signature]), size=int(rng.integers(1, 61)))
            instances = [pool[signature][row] for row in rows]
            invalid = (index * requests_per_client + request) % 7 == 3
            if invalid:
                instances[len(instances) // 2] = invalid_instance(signature)
            status, answer = client.post(PATH, {"signature_name": signature, "instances": instances})
            statuses.append(status)
            if invalid:
                assert status == 400 and sorted(answer) == ["error"], (status, answer)
                continue
            assert status == 200, answer
            for row, prediction in zip(rows, answer["predictions"], strict=True):
                largest = max(
                    largest, float(np.abs(np.array(prediction["probabilities"]) - single[signature, row]).max())
                )
        return statuses, largest

    with concurrent.futures.ThreadPoolExecutor(clients) as threads:
        results = list(threads.map(worker, range(clients)))
    return [status for statuses, _ in results for status in statuses], max(largest for _, largest in results)


def test_mixed_signatures_under_load_every_answer_equal_to_the_single_one(served):
    """16 clients x 12 mixed requests with batching on (the full soak, 64 x 100, is marked
    slow): nothing hangs (each request has 120 s), every good answer equals the answer to
    its instance alone within 1e-5, every bad one is a 400, and the server still serves."""
    client, _, _ = served
    statuses, largest = soak(client, clients=16, requests_per_client=12)
    assert len(statuses) == 16 * 12 and set(statuses) == {200, 400}
    assert largest <= BATCHING_TOLERANCE, largest
    assert client.get("/v1/models/cifar10_resnet20")[0] == 200


@pytest.fixture(scope="module", params=tuple(RUNTIMES))
def soak_served(exported, request):
    """`exported` served with each runtime for the full soak, with a 60 s request timeout:
    64 client threads of one Python process, building bodies of up to 700 KB of JSON on the
    server's own 2 cores, took more than the default 10 s to send some of them (408)."""
    server, port = start_server(
        exported, "--max-batch", str(MAX_BATCH), "--runtime", request.param, "--request-timeout", "60"
    )
    yield Client(f"http://127.0.0.1:{port}")
    stop_server(server)


@pytest.mark.slow
def test_soak_64_clients_x_100_mixed_requests(soak_served):
    statuses, largest = soak(soak_served, clients=64, requests_per_client=100)
    print(f"soak: {len(statuses)} requests, {statuses.count(400)} refused, largest difference {largest:.3g}")
    assert len(statuses) == 6400 and set(statuses) == {200, 400} and largest <= BATCHING_TOLERANCE


# 2. TCP_NODELAY -------------------------------------------------------------------------


def test_accepted_connections_have_tcp_nodelay():
    """The server's listening socket says TCP, so asyncio sets TCP_NODELAY on every
    connection it accepts (no 40 ms wait for a delayed ACK on kept-alive responses)."""
    listening = listening_socket("127.0.0.1", 0)
    assert listening.proto == socket.IPPROTO_TCP

    async def accepted_option():
        options = []

        def accepted(reader, writer):
            options.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(accepted, sock=listening)
        _, writer = await asyncio.open_connection("127.0.0.1", listening.getsockname()[1])
        for _ in range(100):
            if options:
                break
            await asyncio.sleep(0.01)
        writer.close()
        server.close()
        return options

    assert asyncio.run(accepted_option()) == [1]


def test_kept_alive_requests_are_answered_on_one_connection(served):
    _, port, _ = served
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        sockets = []
        for _ in range(20):
            connection.request("GET", "/v1/models/cifar10_resnet20")
            answer = connection.getresponse()
            assert answer.status == 200
            assert json.loads(answer.read())["model_version_status"][0]["state"] == "AVAILABLE"
            assert not answer.will_close
            sockets.append(connection.sock)
        assert len(set(map(id, sockets))) == 1 and sockets[0] is not None
    finally:
        connection.close()


# 3. Animated GIFs and every format for 1- and 3-channel models ---------------------------


def encoded_image(array, image_format):
    encoded = io.BytesIO()
    Image.fromarray(array).save(encoded, format=image_format)
    return encoded.getvalue()


def test_an_animated_gif_is_decoded_to_its_first_frame_only(served):
    """Eight GIFs of a 64 x 64 frame and 16 frames of 4096 x 4096 in one request: the later
    frames are never decoded (TensorFlow's decoder would decode them all, 1.6 s each); the
    answer is the first frame's, as a PNG of that frame is answered."""
    client, _, _ = served
    bomb = animated_gif_bomb()
    assert tf.io.decode_image(animated_gif_bomb(frames=1), expand_animations=False).shape == (4096, 4096, 3)
    status, answer = client.post(PATH, {"instances": [b64(bomb)] * 8})
    assert status == 200, answer
    first_frame = encoded_image(np.full((64, 64, 3), 128, np.uint8), "PNG")
    status, expected = client.post(PATH, {"instances": [b64(first_frame)]})
    for prediction in answer["predictions"]:
        np.testing.assert_allclose(
            prediction["probabilities"], expected["predictions"][0]["probabilities"], atol=BATCHING_TOLERANCE
        )


def test_a_gif_is_cut_after_its_first_frame_without_decoding():
    """The file both runtimes decode is the GIF's bytes up to its first frame's end, then the
    trailer: one frame, 64 x 64, whatever follows it; a GIF cut short is left whole."""
    head, block = gif_parts(encoded_image(np.full((64, 64), 128, np.uint8), "GIF"))
    bomb = animated_gif_bomb()
    cut = image_formats.first_gif_frame(bomb)
    assert cut == head + block + b";"
    with Image.open(io.BytesIO(cut)) as image:
        assert image.size == (64, 64) and getattr(image, "n_frames", 1) == 1
    assert image_formats.first_gif_frame(bomb[: len(head) + 20]) == bomb[: len(head) + 20]


def test_a_gif_of_tiny_sub_blocks_is_refused_in_milliseconds_on_both_runtimes(served):
    """A 64 x 64 GIF's frame in 10 million one-byte sub-blocks (20 MB: a parse thread was held
    1.1 s walking them): the same 400 from both runtimes, at once, past the frame's pixels' worth
    of sub-blocks (2 bytes a pixel in 255-byte sub-blocks, and 64 more: 96)."""
    client, _, _ = served
    started = time.perf_counter()
    status, answer = client.post(PATH, {"instances": [b64(gif_of_one_byte_sub_blocks(10_000_000))]})
    assert status == 400 and answer["error"].endswith(
        "instance 0 (20000038 bytes): a GIF whose sub-blocks for its 64 x 64 frame are more than 96 (an encoder "
        "writes them 255 bytes long): this server reads no more"
    ), answer
    assert time.perf_counter() - started < 5  # the body's 27 MB of JSON included
    assert image_formats.first_gif_frame(gif_of_one_byte_sub_blocks(96))
    with pytest.raises(ValueError, match="more than 96"):
        image_formats.first_gif_frame(gif_of_one_byte_sub_blocks(97))


def test_a_gif_is_answered_as_the_saved_model_decodes_it(served, exported):
    """The server's answer to a GIF (palette, transparency), cut after its first frame, against the
    SavedModel's own GIF decoding: the same probabilities."""
    client, _, _ = served
    pixels = random_pixels(2, CIFAR, seed=9)
    gifs = []
    for image in pixels:
        palette = Image.fromarray(image).quantize(64)
        encoded = io.BytesIO()
        palette.save(encoded, format="GIF", transparency=0)
        gifs.append(encoded.getvalue())
    status, answer = client.post(PATH, {"instances": [b64(gif) for gif in gifs]})
    assert status == 200, answer
    expected = saved_model.predict_encoded(str(exported / "1"), gifs)["probabilities"]
    for prediction, probabilities in zip(answer["predictions"], expected, strict=True):
        np.testing.assert_allclose(prediction["probabilities"], probabilities, atol=1e-5)


@pytest.fixture(scope="module")
def grey_model(tmp_path_factory):
    """A calibrated 1-channel ResNet-20 of 16 x 16 images, SavedModel and ONNX."""
    grey = export.Preprocessing(16, 1, (120.0,), (60.0,))
    pixels = random_pixels(8, grey, seed=2)
    network = calibrated(keras_preact.ResNet20(input_shape=grey.shape, classes=3), grey, pixels)
    directory = tmp_path_factory.mktemp("grey") / "grey_resnet20"
    export.export_saved_model(
        network, str(directory), ["a", "b", "c"], grey, formats=("saved_model", "onnx"), verbose=False
    )
    return directory, grey


@pytest.mark.parametrize("runtime", tuple(RUNTIMES))
def test_every_format_works_for_1_and_3_channel_models(grey_model, exported, runtime):
    """JPEG, PNG, GIF and BMP, grey and RGB (and RGBA where the format has it), answered by a
    1-channel and a 3-channel model; the lossless grey ones exactly as their pixels are."""
    rng = np.random.default_rng(4)
    for directory, channels, size in [(grey_model[0], 1, 16), (exported, 3, 32)]:
        model = ModelServer(str(directory), runtime=runtime)
        grey = rng.integers(0, 256, (size, size), dtype=np.uint8)
        colour = rng.integers(0, 256, (size, size, 4), dtype=np.uint8)
        for image_format in ("JPEG", "PNG", "GIF", "BMP"):
            images = [grey, colour[..., :3]] + ([colour] if image_format in ("PNG", "BMP") else [])
            body = json.dumps({"instances": [b64(encoded_image(image, image_format)) for image in images]})
            predictions = model.predict(body.encode())["predictions"]
            assert len(predictions) == len(images), (channels, image_format)
            if image_format in ("PNG", "BMP", "GIF"):
                pixels = grey[None, :, :, None].repeat(channels, axis=-1)
                expected = model.predict(
                    json.dumps({"signature_name": "predict_pixels", "instances": pixels.tolist()}).encode()
                )["predictions"][0]
                np.testing.assert_allclose(predictions[0]["probabilities"], expected["probabilities"], atol=1e-5)


# 4. Large JSON bodies ---------------------------------------------------------------------


def memory_megabytes(process, field="VmHWM"):
    """A process's peak ("VmHWM") or current ("VmRSS") resident memory, in MiB."""
    with open(f"/proc/{process.pid}/status") as status:
        return int(next(line for line in status if line.startswith(f"{field}:")).split()[1]) / 1024


def test_a_body_of_millions_of_values_is_refused_before_it_is_parsed(served):
    """The battery's 57 MB body of 15 million floats, four at once: each refused with a 413
    from a count of its separators, before JSON makes a Python float of it; the server's
    peak memory grows by a few times the bodies' size at most (parsed, they took 733 MB
    each), and it still serves."""
    client, _, server = served
    body = b'{"signature_name": "predict_normalized", "instances": [' + b"0.1," * 14_250_000 + b"0.1]}"
    status, answer = client.post(PATH, b"{}")
    before = memory_megabytes(server)
    with concurrent.futures.ThreadPoolExecutor(4) as threads:
        answers = list(threads.map(lambda _: client.post(PATH, body), range(4)))
    for status, answer in answers:
        assert status == 413 and answer["error"].startswith("The request holds too many values: "), answer
        assert answer["error"].endswith(
            f"where {MAX_BATCH} instances (--max-batch) of this model's largest input "
            f"hold at most {MAX_BATCH * (32 * 32 * 3 + 32 * 32 + 32) + 16:,}."
        )
    assert memory_megabytes(server) - before < 4 * 3 * 57, (before, memory_megabytes(server))
    status, answer = client.post(PATH, {"instances": [b64(jpegs(random_pixels(1, CIFAR))[0])]})
    assert status == 200


@pytest.mark.parametrize("runtime", tuple(RUNTIMES))
def test_bodies_past_the_memory_bound_are_read_dropped_and_answered_503(exported, runtime):
    """`--max-body-memory 16` (MiB): three clients send 7 MiB of their 10 MiB bodies, wait
    for one another, then send the rest. The three first parts together pass 16 MiB before
    any request can end, so at least one body is dropped as it is read and answered 503
    with Retry-After on its open connection (not reset); afterwards a lone 10 MiB body is
    held and parsed again (400: not an image)."""
    server, port = start_server(exported, "--runtime", runtime, "--max-body-memory", "16")
    body = b'{"instances": ["' + b"a" * (10 * 2**20) + b'"]}'
    first = 7 * 2**20
    together = threading.Barrier(3)

    def send(_):
        with socket.create_connection(("127.0.0.1", port), timeout=60) as connection:
            connection.sendall(PREDICT + b"Host: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:first])
            together.wait(timeout=60)
            connection.sendall(body[first:])
            answer = http.client.HTTPResponse(connection)
            answer.begin()
            return answer.status, answer.getheader("Retry-After"), json.loads(answer.read())["error"]

    try:
        with concurrent.futures.ThreadPoolExecutor(3) as threads:
            answers = list(threads.map(send, range(3)))
        busy = (
            503,
            "1",
            "The server is busy: the request bodies it holds pass 16 MiB (--max-body-memory). Retry after 1 s.",
        )
        assert busy in answers and all(answer == busy or answer[0] == 400 for answer in answers), answers
        status, answer = Client(f"http://127.0.0.1:{port}").post(PATH, body)
        assert status == 400 and answer["error"].startswith(UNDECODABLE), answer
    finally:
        stop_server(server)


@pytest.mark.parametrize("runtime", tuple(RUNTIMES))
def test_memory_after_large_requests_comes_back_within_20_percent_of_warm(exported, runtime):
    """A fresh server warmed by 64 requests of 8 JPEGs, then four requests of the largest
    images at once (four 4096 x 4096 PNGs each, 27 MB of JSON) and four 57 MB bodies of
    numbers at once, then the 64 requests again: its resident memory within 20 % of what it
    was warm (measured 110 % on onnxruntime, 111 % on TensorFlow; 551 % and 135 % without
    `serving.memory`)."""
    server, port = start_server(exported, "--runtime", runtime)
    client = Client(f"http://127.0.0.1:{port}")
    small = {"instances": [b64(image) for image in jpegs(random_pixels(8, CIFAR, seed=1))]}
    rng = np.random.default_rng(0)
    field = Image.fromarray(rng.integers(0, 256, (16, 16, 3), np.uint8)).resize((4096, 4096), Image.BILINEAR)
    large = json.dumps({"instances": [b64(encoded_image(np.asarray(field), "PNG"))] * 4}).encode()
    numbers = b'{"signature_name": "predict_normalized", "instances": [' + b"0.1," * 14_250_000 + b"0.1]}"

    def at_once(body, count):
        with concurrent.futures.ThreadPoolExecutor(count) as threads:
            return [status for status, _ in threads.map(lambda _: client.post(PATH, body), range(count))]

    try:
        assert at_once(small, 8) == [200] * 8 and at_once(small, 8) == [200] * 8
        warm = memory_megabytes(server, "VmRSS")
        assert at_once(large, 4) == [200] * 4 and at_once(numbers, 4) == [413] * 4
        assert [at_once(small, 8) for _ in range(8)] == [[200] * 8] * 8
        time.sleep(1)  # the last trim runs on the parsing thread after its request
        assert memory_megabytes(server, "VmRSS") <= 1.2 * warm, (warm, memory_megabytes(server, "VmRSS"))
    finally:
        stop_server(server)


# 5. HTTP framing ---------------------------------------------------------------------------

SMUGGLED = b"GET /v1/models/cifar10_resnet20 HTTP/1.1\r\nHost: x\r\n\r\n"


def test_content_length_with_chunked_is_refused_and_closed(served):
    """RFC 9112, section 6.1: a request with both framings is answered once and its
    connection closed; the request pipelined after it is never answered."""
    _, port, _ = served
    body = b'{"instances": []}'
    request = PREDICT + b"Host: x\r\nContent-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (
        len(body),
        len(body),
        body,
    )
    received = raw_exchange(port, request + SMUGGLED)
    assert received.startswith(b"HTTP/1.1 400 ") and received.count(b"HTTP/1.1 ") == 1, received[:300]
    head, answer = received.split(b"\r\n\r\n", 1)
    assert b"connection: close" in head.lower()
    assert json.loads(answer) == {
        "error": "The request has both Content-Length and Transfer-Encoding: send one of them."
    }


def test_a_half_close_is_the_client_leaving(served):
    """The server reports a client that closes its side of the connection as gone: a request
    that waits for the network is dropped, and told so where the socket still takes an answer;
    one answered at once is answered. The server is paused while the request and the half-close
    are sent, so that it finds both waiting (a client paused between them by a busy machine would
    otherwise be answered before it closed, rightly)."""
    _, port, server = served
    body = json.dumps({"instances": [b64(jpegs(random_pixels(1, CIFAR))[0])]}).encode()
    predict = PREDICT + b"Host: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    for request, status in ((predict, 400), (SMUGGLED, 200)):
        with socket.create_connection(("127.0.0.1", port), timeout=60) as connection:
            server.send_signal(signal.SIGSTOP)
            try:
                connection.sendall(request)
                connection.shutdown(socket.SHUT_WR)
            finally:
                server.send_signal(signal.SIGCONT)
            received = b""
            while chunk := connection.recv(65536):
                received += chunk
        assert received.startswith(b"HTTP/1.1 %d " % status), received[:300]
        assert received.count(b"HTTP/1.1 ") == 1
        if status == 400:
            assert json.loads(received.split(b"\r\n\r\n", 1)[1])["error"].endswith("the request was dropped.")


def test_expect_100_continue_with_a_body_too_large_gets_the_413_first(served):
    """The body is never invited: no `100 Continue` before the 413, and the connection closed;
    a body within the bound is invited as HTTP/1.1 says."""
    _, port, _ = served
    head = PREDICT + b"Host: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n"
    received = raw_exchange(port, head % 100_000_000, timeout=10)
    assert received.startswith(b"HTTP/1.1 413 ") and b"HTTP/1.1 100" not in received, received[:300]
    assert json.loads(received.split(b"\r\n\r\n", 1)[1]) == {
        "error": "The request body is too large: at most 67108864 bytes. Received: 100000000"
    }
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(head % 17)
        assert connection.recv(100).startswith(b"HTTP/1.1 100 ")


@pytest.mark.parametrize("method", [b"get", b"Get", b"post"])
def test_methods_are_case_sensitive(served, method):
    """RFC 9110, section 9.1: `get` is not GET (Hypercorn upper-cases a method; the server
    compares it with the method sent), a 405 in JSON, whatever header a client adds to pass."""
    _, port, _ = served
    received = raw_exchange(
        port, method + b" /v1/models/cifar10_resnet20 HTTP/1.1\r\nHost: x\r\nX-Keras-Preact-Method: GET\r\n\r\n"
    )
    assert received.startswith(b"HTTP/1.1 405 ") and received.count(b"HTTP/1.1 ") == 1, received[:300]
    assert json.loads(received.split(b"\r\n\r\n", 1)[1]) == {
        "error": f"Method {method.decode()!r} is not allowed: methods are case-sensitive (RFC 9110, section 9.1); "
        "use GET or POST."
    }


def test_an_http_version_other_than_1_is_a_505(served):
    _, port, _ = served
    received = raw_exchange(port, b"GET /v1/models/cifar10_resnet20 HTTP/2.0\r\nHost: x\r\n\r\n" + SMUGGLED)
    assert received.startswith(b"HTTP/1.1 505 ") and received.count(b"HTTP/1.1 ") == 1, received[:300]
    assert json.loads(received.split(b"\r\n\r\n", 1)[1]) == {
        "error": "HTTP/2.0 is not supported: this server speaks HTTP/1.1."
    }


# HTTP/2's preface and a CONNECT stream without :path (h2's frames as a client sends them).
HTTP2_CONNECT = bytes.fromhex(
    "505249202a20485454502f322e300d0a0d0a534d0d0a0d0a00002a04000000000000010000100000020000000100040000ffff"
    "00050000400000080000000000030000006400060001000000000e0105000000014287bdab4e9c17b7ff4183f3703f"
)


@pytest.mark.parametrize(
    "request_bytes",
    [
        HTTP2_CONNECT,
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000") + b"\x00" * 40_000,
    ],
    ids=["http2-connect", "http2-settings-then-junk"],
)
def test_http2_is_a_505_in_json_and_the_connection_closed(served, request_bytes):
    """The server speaks HTTP/1.1 alone (TF Serving's REST API): HTTP/2's preface is answered 505
    in TF Serving's JSON, and the server closes the connection, whatever the client sends after."""
    _, port, _ = served
    started = time.perf_counter()
    received = raw_exchange(port, request_bytes, timeout=10)
    assert time.perf_counter() - started < 5
    assert received.startswith(b"HTTP/1.1 505 ") and received.count(b"HTTP/1.1 ") == 1, received[:300]
    assert json.loads(received.split(b"\r\n\r\n", 1)[1]) == {
        "error": "HTTP/2.0 is not supported: this server speaks HTTP/1.1."
    }


@pytest.mark.parametrize(
    "upgrade",
    [
        b"Upgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n",
        b"Upgrade: websocket\r\nConnection: Upgrade\r\n",  # and no Sec-WebSocket-Key
        b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Version: 13\r\n",
    ],
    ids=["h2c", "websocket-without-key", "websocket"],
)
def test_a_request_asking_for_an_upgrade_is_answered_in_http1(served, upgrade):
    """No switch of protocol: the request is answered as the HTTP/1.1 request it also is, in
    JSON, and its connection kept alive or closed as any other (here closed, as asked)."""
    _, port, _ = served
    received = raw_exchange(
        port,
        b"GET /v1/models/cifar10_resnet20 HTTP/1.1\r\nHost: x\r\n"
        + upgrade.replace(b"Connection: Upgrade", b"Connection: Upgrade, close")
        + b"\r\n",
        timeout=10,
    )
    assert received.startswith(b"HTTP/1.1 200 ") and received.count(b"HTTP/1.1 ") == 1, received[:300]
    assert json.loads(received.split(b"\r\n\r\n", 1)[1])["model_version_status"][0]["state"] == "AVAILABLE"


def test_the_server_log_holds_no_traceback_for_http2_frames(exported, tmp_path):
    """What HTTP/2 clients send (the CONNECT stream without :path that ended in an
    UnboundLocalError's traceback, PRIORITY frames, junk after the preface) leaves no traceback
    and no more than a line a connection in the server's log."""
    log = tmp_path / "server.log"
    port = free_port()
    with open(log, "w") as output:
        server = subprocess.Popen(
            [KERAS_PREACT, "serve", str(exported), "--port", str(port), "--runtime", "onnxruntime"],
            stdout=subprocess.PIPE,
            stderr=output,
            text=True,
        )
        try:
            assert server.stdout.readline().startswith("Serving")
            priorities = bytes.fromhex("0000050200000000030000000010") * 3_000  # PRIORITY frames
            for request in (HTTP2_CONNECT, HTTP2_CONNECT + priorities, HTTP2_CONNECT[:24] + b"\xff" * 48_000):
                for _ in range(5):
                    raw_exchange(port, request, timeout=10)
        finally:
            stop_server(server)
    text = log.read_text()
    assert "Traceback" not in text and len(text.splitlines()) <= 15, text[-3000:]


def status_on(connection):
    """(status, the model's state or the error) of GET /v1/models/cifar10_resnet20 on `connection`."""
    connection.request("GET", "/v1/models/cifar10_resnet20")
    response = connection.getresponse()
    answer = json.loads(response.read())
    return response.status, answer["error"] if "error" in answer else answer["model_version_status"][0]["state"]


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="prlimit (util-linux) is not installed")
@pytest.mark.parametrize("runtime", tuple(RUNTIMES))
def test_connections_past_the_bound_are_refused_in_json_and_connected_clients_answered(exported, runtime):
    """Under the usual limit of 1,024 descriptors, 700 idle connections: the server serves 512
    at once (`server.connection_bounds`), answers a new connection past them 503 in TF Serving's
    JSON, keeps answering a client already connected, holds well under its limit of descriptors,
    and serves new connections again within the keep-alive deadline once the crowd has left."""
    port = free_port()
    server = subprocess.Popen(
        ["prlimit", "--nofile=1024", KERAS_PREACT, "serve", str(exported), "--port", str(port), "--runtime", runtime],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    held = []
    try:
        assert server.stdout.readline().startswith("Serving")
        kept = http.client.HTTPConnection("127.0.0.1", port, timeout=30)  # one connection, kept alive
        assert status_on(kept) == (200, "AVAILABLE")
        held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(700)]
        time.sleep(1.5)  # the refused ones answered and closed
        assert len(os.listdir(f"/proc/{server.pid}/fd")) < 800
        assert status_on(kept) == (200, "AVAILABLE")
        assert status_on(http.client.HTTPConnection("127.0.0.1", port, timeout=30)) == (
            503,
            "The server is serving 512 connections, its most at once: try again in a moment.",
        )
        for connection in held:
            connection.close()
        deadline = time.monotonic() + 30
        while status_on(http.client.HTTPConnection("127.0.0.1", port, timeout=30))[0] != 200:
            assert time.monotonic() < deadline, "still refused 30 s after the crowd left"
            time.sleep(0.5)
        assert server.poll() is None
    finally:
        for connection in held:
            connection.close()
        stop_server(server)


def test_the_private_hypercorn_methods_replaced_for_http1_alone_are_there(monkeypatch):
    """`server.http1_only` replaces `hypercorn.protocol.h11.H11Protocol._check_protocol(self,
    event)` and wraps `_create_stream(self, request)`, and `server.bound_connections` wraps
    `hypercorn.asyncio.tcp_server.TCPServer.run(self)` (whose `reader` and `writer` it uses),
    private parts of the pinned Hypercorn 0.18: this fails when they change."""
    import inspect

    from hypercorn.asyncio.tcp_server import TCPServer
    from hypercorn.protocol.h11 import H11Protocol

    from keras_preact_training.serving import server

    assert importlib_version("hypercorn").startswith("0.18.")
    for owner, name, parameters in (
        (H11Protocol, "_check_protocol", ["self", "event"]),
        (H11Protocol, "_create_stream", ["self", "request"]),
        (TCPServer, "run", ["self"]),
    ):
        method = getattr(owner, name)
        assert inspect.iscoroutinefunction(method) and list(inspect.signature(method).parameters) == parameters
    assert list(inspect.signature(TCPServer.__init__).parameters)[-2:] == ["reader", "writer"]
    # Put back as they were after the test, for any other in this process.
    for owner, name in ((H11Protocol, "_check_protocol"), (H11Protocol, "_create_stream"), (TCPServer, "run")):
        monkeypatch.setattr(owner, name, getattr(owner, name))
    monkeypatch.setattr(H11Protocol, "http1_only", False, raising=False)
    monkeypatch.setattr(TCPServer, "unbounded_run", TCPServer.run, raising=False)
    server.http1_only()
    server.bound_connections(8, 4)
    assert H11Protocol.http1_only and TCPServer.unbounded_run.__qualname__ == "TCPServer.run"


# 6. The ONNX models are checked at start -----------------------------------------------------


def damaged_copy(exported, tmp_path, change):
    directory = tmp_path / "cifar10_resnet20"
    shutil.copytree(exported, directory)
    change(directory / "1")
    return directory


def edit_metadata(edit):
    def change(version):
        metadata = json.loads((version / "metadata.json").read_text())
        edit(metadata)
        (version / "metadata.json").write_text(json.dumps(metadata))

    return change


def swap_onnx_files(version, precision="float32"):
    pixels, normalized = (
        version / contract.onnx_file(name, precision) for name in ("predict_pixels", "predict_normalized")
    )
    content = pixels.read_bytes()
    pixels.write_bytes(normalized.read_bytes())
    normalized.write_bytes(content)


ONNX = "{version}/onnx/predict_pixels.onnx"


@pytest.mark.parametrize(
    "change, message",
    [
        (
            edit_metadata(lambda metadata: metadata.update(class_names=["a", "b", "c"])),
            "The ONNX model {version}/onnx/predict_pixels.onnx answers {{'class_ids': [None], 'logits': [None, 10], "
            "'probabilities': [None, 10]}}, where metadata.json's 3 classes need ['logits', 'probabilities', 'class_ids'] "
            "with 3 "
            "logits: the file belongs to another model. Export the model again.",
        ),
        (
            edit_metadata(lambda metadata: metadata.update(class_names=metadata["class_names"][::-1])),
            f"{{version}}/metadata.json is not the one exported with the ONNX model {ONNX} (edited, or another "
            'export\'s): it says class_names=["truck", "ship", "horse", "frog", "dog", "deer", "cat", "bird", '
            '"automobile", "airplane"] where the model has ["airplane", "automobile", "bird", "cat", "deer", "dog", '
            '"frog", "horse", "ship", "truck"]. Export the model again.',
        ),
        (
            edit_metadata(lambda metadata: metadata.update(top_k=3)),
            f"{{version}}/metadata.json is not the one exported with the ONNX model {ONNX} (edited, or another "
            "export's): it says top_k=3 where the model has 5. Export the model again.",
        ),
        (
            edit_metadata(lambda metadata: metadata["input"].update(normalization_mean=[126.3, 123.0, 113.9])),
            f"{{version}}/metadata.json is not the one exported with the ONNX model {ONNX} (edited, or another "
            'export\'s): it says input={{"channels": 3, "crop": "resize", "image_size": 32, "normalization_mean": '
            '[126.3, 123.0, 113.9], "normalization_std": [63.0, 62.1, 66.7], "pixel_range": [0, 255]}} where the '
            'model has {{"channels": 3, "crop": "resize", "image_size": 32, "normalization_mean": [125.3, 123.0, '
            "113.9], ",
        ),
        (
            edit_metadata(lambda metadata: metadata["input"].update(crop="central_crop")),
            f"{{version}}/metadata.json is not the one exported with the ONNX model {ONNX} (edited, or another "
            'export\'s): it says input={{"channels": 3, "crop": "central_crop", ',
        ),
        (
            edit_metadata(lambda metadata: metadata.pop("class_names")),
            "{version}/metadata.json has no list of class names ('class_names'): export the model again.",
        ),
        (
            lambda version: (version / "onnx" / "predict_pixels.onnx").write_bytes(b""),
            f"The ONNX model {ONNX} is not the one exported with {{version}}/metadata.json: its SHA-256 differs from the "
            "recorded",
        ),
        (
            lambda version: (
                (version / "onnx" / "predict_pixels.onnx").unlink(),
                os.mkfifo(version / "onnx" / "predict_pixels.onnx"),
            ),
            f"The ONNX model {ONNX} is missing or not a regular file: export the model again.",
        ),
        (
            lambda version: ((version / "metadata.json").unlink(), os.mkfifo(version / "metadata.json")),
            "{version}/metadata.json is not a regular file (a FIFO, a socket or a device): export the model again.",
        ),
        (
            swap_onnx_files,
            f"The ONNX model {ONNX} is not the one exported with {{version}}/metadata.json: its SHA-256 ",
        ),
        (
            lambda version: (
                swap_onnx_files(version),
                edit_metadata(lambda metadata: metadata["onnx"].pop("sha256"))(version),
            ),
            f"The ONNX model {ONNX} takes [('normalized', 'tensor(float)', [None, 32, 32, 3])], where its signature takes "
            "[('pixels', 'tensor(uint8)', [None, 32, 32, 3])]: the file belongs to another signature or model.",
        ),
        (
            lambda version: (
                edit_metadata(lambda metadata: metadata["onnx"].pop("sha256"))(version),
                (version / "onnx" / "predict_pixels.onnx").write_bytes(
                    (version / "onnx" / "predict_pixels.onnx").read_bytes()[:5000]
                ),
            ),
            f"Could not load the ONNX model {ONNX} (missing, empty, truncated or corrupt: export it again): ",
        ),
    ],
    ids=[
        "3 class names for 10 outputs",
        "class names reordered",
        "top_k 3 for 5",
        "a mean moved by 1",
        "another crop",
        "no class names",
        "empty file",
        "a FIFO for a file",
        "a FIFO for metadata.json",
        "files swapped",
        "files swapped, no hashes",
        "truncated, no hashes",
    ],
)
def test_onnx_files_are_checked_at_start(exported, tmp_path, change, message):
    directory = damaged_copy(exported, tmp_path, change)
    with pytest.raises(ValueError) as error:
        ModelServer(str(directory), runtime="onnxruntime")
    assert str(error.value).startswith(message.format(version=directory / "1")), str(error.value)
    assert "\n" not in str(error.value)


def test_a_version_missing_an_onnx_model_is_not_served_by_onnxruntime(exported, tmp_path):
    directory = damaged_copy(exported, tmp_path, lambda version: (version / "onnx" / "predict_pixels.onnx").unlink())
    with pytest.raises(FileNotFoundError, match=r"^No complete version folder with ONNX models .* in "):
        ModelServer(str(directory), runtime="onnxruntime")


def test_the_onnx_hashes_and_answer_fields_are_recorded_at_export(exported):
    metadata = contract.read_metadata(str(exported / "1"))
    for signature, file in metadata["onnx"]["files"].items():
        assert metadata["onnx"]["sha256"][signature] == pretrained.sha256(str(exported / "1" / file))
        properties = onnx.load(str(exported / "1" / file)).metadata_props
        assert {entry.key: json.loads(entry.value) for entry in properties} == {
            contract.ONNX_ANSWER_KEY: {field: metadata[field] for field in contract.ANSWER_FIELDS}
        }


def test_onnx_models_of_an_older_export_are_served_with_a_warning(exported, tmp_path):
    def older(version):
        for name in contract.ONNX_MODELS:
            model = onnx.load(str(version / contract.onnx_file(name)))
            del model.metadata_props[:]
            onnx.save(model, str(version / contract.onnx_file(name)))
        edit_metadata(lambda metadata: metadata["onnx"].pop("sha256"))(version)

    directory = damaged_copy(exported, tmp_path, older)
    with pytest.warns(UserWarning) as warned:
        server = ModelServer(str(directory), runtime="onnxruntime")
    messages = [str(warning.message) for warning in warned]
    assert any("records no SHA-256 of the ONNX models" in message for message in messages), messages
    assert any(
        "records no class names, input or top_k" in message and "served unchecked" in message for message in messages
    ), messages
    assert server.runtime.name == "onnxruntime"


def test_the_tensorflow_runtime_checks_the_class_names_too(exported, tmp_path):
    directory = damaged_copy(exported, tmp_path, edit_metadata(lambda metadata: metadata.update(class_names=["a"])))
    with pytest.raises(ValueError, match=r"metadata.json names 1 classes, but the signature '\w+' has 10 logits"):
        ModelServer(str(directory), runtime="tensorflow")


def test_a_bad_start_is_one_line_and_auto_falls_back_to_the_saved_model(exported, tmp_path):
    directory = damaged_copy(
        exported, tmp_path, lambda version: (version / "onnx" / "predict_pixels.onnx").write_bytes(b"truncated")
    )
    result = serve_command(str(directory), "--port", str(free_port()), "--runtime", "onnxruntime")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and str(directory / "1" / "onnx" / "predict_pixels.onnx") in errors[0]

    server, port = start_server(directory, "--runtime", "auto")
    try:
        status, _ = Client(f"http://127.0.0.1:{port}").post(
            PATH, {"instances": [b64(jpegs(random_pixels(1, CIFAR))[0])]}
        )
        assert status == 200
    finally:
        stop_server(server)
    warning = server.stderr.read()
    assert "warning: serving the SavedModel with TensorFlow instead of the ONNX models: The ONNX model " in warning


# 7. Other files and folders --------------------------------------------------------------------


def test_a_folder_name_no_url_reaches_is_refused(exported, tmp_path):
    directory = tmp_path / "a:b"
    shutil.copytree(exported, directory)
    with pytest.raises(ValueError, match=r"^The model folder's name 'a:b' cannot be served: .* Rename the folder"):
        ModelServer(str(directory))


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "is not valid JSON"),
        (
            '{"cifar10": {"resnet20": {"file": "x.weights.h5"}}}',
            "is damaged: its entry cifar10.resnet20 lacks sha256, test_error",
        ),
        ('{"cifar10": ["resnet20"]}', "is damaged: its entry cifar10 lacks file, sha256, test_error"),
        ("[1, 2]", "must map data sets to networks"),
    ],
    ids=["not JSON", "entry without fields", "not a mapping of networks", "a list"],
)
def test_a_malformed_registry_is_an_error_that_names_it(tmp_path, content, message):
    path = tmp_path / "registry.json"
    path.write_text(content)
    with pytest.raises(ValueError) as error:
        pretrained.registry(str(path))
    assert str(error.value).startswith(f"The weights registry {path} ") and message in str(error.value)
    assert "reinstall keras-preact, or restore the file" in str(error.value)


def test_corrupt_metadata_and_summary_name_their_path(exported, tmp_path):
    directory = damaged_copy(exported, tmp_path, lambda version: (version / "metadata.json").write_text('{"name'))
    with pytest.raises(
        ValueError,
        match=rf"^{directory / '1' / 'metadata.json'} is not valid JSON \(truncated or "
        r"corrupt: .*\): export the model again.",
    ):
        ModelServer(str(directory))
    run = tmp_path / "run"
    run.mkdir()
    (run / "model.keras").write_bytes(b"")
    (run / "summary.json").write_text("[]")
    with pytest.raises(ValueError, match=rf"^{run / 'summary.json'} must hold a JSON object. Received: list. Train"):
        export.export_run(str(run))


def cli(*arguments):
    return subprocess.run(
        [KERAS_PREACT, *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow"),
    )


def test_an_output_or_run_folder_under_a_regular_file_is_a_clear_error(tmp_path):
    blocking = tmp_path / "a_file"
    blocking.write_text("")
    result = cli("export", "--model", "resnet20", "--weights", "cifar10", "--output", str(blocking / "models"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert (
        f"error: Cannot make the model folder {blocking / 'models' / 'cifar10_resnet20'}: {blocking} is a file, "
        "not a folder."
    ) in result.stderr
    result = cli("train", "--run-dir", str(blocking / "run"), "--set", "duration=1")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert f"error: Cannot make the run folder {blocking / 'run'}: {blocking} is a file, not a folder." in result.stderr


def test_query_of_a_folder_or_a_fifo_is_one_line(tmp_path):
    fifo = tmp_path / "fifo.jpg"
    os.mkfifo(fifo)  # opened, it would wait for a writer
    for path in (tmp_path, fifo):
        result = cli("query", "--model", "m", "--server", "http://127.0.0.1:9", str(path))
        assert result.returncode == 2 and result.stderr == f"error: No image file {str(path)!r}.\n", result.stderr


class NotJson(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<html>a web page</html>")

    def log_message(self, *arguments):
        pass


def test_query_against_a_server_that_does_not_answer_json(tmp_path):
    image = tmp_path / "image.jpg"
    image.write_bytes(jpegs(random_pixels(1, CIFAR))[0])
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotJson) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(ValueError) as error:
            query_client.query(url, "m", [str(image)])
        server.shutdown()
    assert str(error.value) == (
        f"{url}/v1/models/m:predict answered 200 with a body that is not a JSON object, so it "
        "is not TF Serving's REST API (is --server right?). "
        "Received: '<html>a web page</html>'"
    )
