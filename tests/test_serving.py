"""`keras-preact serve`: TF Serving's REST API over HTTP, against the real server process."""

import asyncio
import base64
import concurrent.futures
import contextlib
import io
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.request
import zlib

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import keras_preact
from keras_preact_training import export
from keras_preact_training.data import input_tensorflow
from keras_preact_training.export import contract
from keras_preact_training.serving.batching import Batcher
from keras_preact_training.serving.model import RUNTIMES, ModelServer
from keras_preact_training.serving.protocol import Parsed
from keras_preact_training.serving.server import onnx_servable
from tests.conftest import KERAS_PREACT
from tests.test_export import CIFAR, CIFAR_CLASSES, calibrated, expected_outputs, normalize, random_pixels

pytestmark = pytest.mark.tensorflow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_BATCH = 16


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def b64(encoded):
    return {"b64": base64.b64encode(encoded).decode("ascii")}


class Client:
    def __init__(self, url, runtime=None):
        self.url, self.runtime = url, runtime

    def get(self, path):
        return self.send(urllib.request.Request(self.url + path))

    def post(self, path, body):
        body = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.send(urllib.request.Request(self.url + path, body, {"Content-Type": "application/json"}))

    @staticmethod
    def send(request):
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as error:
            return error.code, json.load(error)


def start_server(directory, *options):
    """`keras-preact serve directory` on a free port; (process, port) once it serves, in the
    environment a user starts it in: without the tests' `TF_ENABLE_ONEDNN_OPTS=1`, so that
    `serve` chooses TensorFlow's kernels itself."""
    port = free_port()
    environment = {name: value for name, value in os.environ.items() if name != "TF_ENABLE_ONEDNN_OPTS"}
    server = subprocess.Popen(
        [KERAS_PREACT, "serve", str(directory), "--port", str(port), *options],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(environment, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow"),
    )
    line = server.stdout.readline()
    assert line.startswith(f"Serving {directory.name} version 1 ("), server.stderr.read()[-3000:]
    return server, port


def stop_server(server):
    server.terminate()
    server.wait(timeout=30)


def export_resnet20(tmp_path_factory, seed):
    """A ResNet-20 calibrated on 16 random images of `seed`, exported to
    <tmp>/cifar10_resnet20/1 as SavedModel and ONNX: (network, pixels, directory)."""
    pixels = random_pixels(16, CIFAR, seed=seed)
    network = calibrated(keras_preact.ResNet20(input_shape=CIFAR.shape, classes=10), CIFAR, pixels)
    directory = tmp_path_factory.mktemp("saved_models") / "cifar10_resnet20"
    export.export_saved_model(
        network, str(directory), CIFAR_CLASSES, CIFAR, formats=("saved_model", "onnx"), verbose=False
    )
    return network, pixels, directory


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export_resnet20(tmp_path_factory, seed=3)


@pytest.fixture(scope="module", params=tuple(RUNTIMES))
def served(exported, request):
    """`exported` served on 127.0.0.1 with each runtime: the SavedModel on TensorFlow, the
    ONNX models on onnxruntime (every test of the API and of hostile input runs on both)."""
    network, pixels, directory = exported
    server, port = start_server(directory, "--max-batch", str(MAX_BATCH), "--runtime", request.param)
    yield network, Client(f"http://127.0.0.1:{port}", request.param), pixels, directory
    stop_server(server)


@pytest.fixture(scope="module")
def limited(served):
    """The same model, on the same runtime, served with one request in flight at most and a
    4 s request timeout (2 s cut off a whole request once, on 2 cores that three other jobs
    shared)."""
    server, port = start_server(
        served[3], "--runtime", served[1].runtime, "--max-in-flight", "1", "--request-timeout", "4"
    )
    yield port
    stop_server(server)


def jpegs(pixels):
    return [tf.io.encode_jpeg(image, quality=95).numpy() for image in pixels]


def decoded(encoded):
    """The pixels the server sees for JPEG bytes (JPEG is lossy; decoding is deterministic)."""
    return np.stack([input_tensorflow.decode_image(image, 3).numpy() for image in encoded])


def assert_prediction_matches(prediction, expected, row):
    np.testing.assert_allclose(prediction["logits"], expected["logits"][row], atol=1e-4)
    np.testing.assert_allclose(prediction["probabilities"], expected["probabilities"][row], atol=1e-5)
    assert prediction["class_ids"] == expected["class_ids"][row]
    assert prediction["classes"] == expected["classes"][row].tolist()
    np.testing.assert_allclose(prediction["scores"], expected["scores"][row], atol=1e-5)


def test_status_and_metadata(served):
    _, client, _, _ = served
    assert client.get("/v1/models/cifar10_resnet20") == (
        200,
        {
            "model_version_status": [
                {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
            ],
            "runtime": client.runtime,
        },
    )
    assert client.get("/v1/models/cifar10_resnet20/versions/1")[0] == 200
    status, metadata = client.get("/v1/models/cifar10_resnet20/metadata")
    assert status == 200 and metadata["model_spec"] == {
        "name": "cifar10_resnet20",
        "signature_name": "",
        "version": "1",
    }
    signatures = metadata["metadata"]["signature_def"]["signature_def"]
    assert sorted(signatures) == sorted(contract.SIGNATURES)
    assert signatures["serving_default"]["inputs"]["images"] == {
        "dtype": "string",
        "tensor_shape": [-1],
        "name": "images",
    }
    assert metadata["metadata"]["keras_preact"]["class_names"] == CIFAR_CLASSES


def test_row_format_predictions_equal_the_keras_model(served):
    network, client, pixels, _ = served
    encoded = jpegs(pixels[:4])
    expected = expected_outputs(network, normalize(decoded(encoded), CIFAR), CIFAR_CLASSES, 5)
    status, response = client.post(
        "/v1/models/cifar10_resnet20:predict", {"instances": [b64(image) for image in encoded]}
    )
    assert status == 200 and len(response["predictions"]) == 4
    for row, prediction in enumerate(response["predictions"]):
        assert sorted(prediction) == sorted(contract.OUTPUTS)
        assert_prediction_matches(prediction, expected, row)
    # Named inputs, a version in the path, and the signature named: the same answer.
    status, named = client.post(
        "/v1/models/cifar10_resnet20/versions/1:predict",
        {"signature_name": "serving_default", "instances": [{"images": b64(image)} for image in encoded]},
    )
    assert status == 200 and named == response


def test_columnar_format_and_the_other_signatures(served):
    network, client, pixels, _ = served
    batch = pixels[:3]
    expected = expected_outputs(network, normalize(batch, CIFAR), CIFAR_CLASSES, 5)
    status, response = client.post(
        "/v1/models/cifar10_resnet20:predict",
        {"signature_name": "predict_pixels", "inputs": {"pixels": batch.tolist()}},
    )
    assert status == 200 and sorted(response) == ["outputs"]
    for row in range(3):
        assert_prediction_matches({name: values[row] for name, values in response["outputs"].items()}, expected, row)
    status, response = client.post(
        "/v1/models/cifar10_resnet20:predict",
        {"signature_name": "predict_normalized", "instances": normalize(batch, CIFAR).tolist()},
    )
    assert status == 200
    for row, prediction in enumerate(response["predictions"]):
        assert_prediction_matches(prediction, expected, row)


def test_query_command_prints_top_classes(served, tmp_path):
    network, client, pixels, _ = served
    encoded = jpegs(pixels[5:7])
    paths = []
    for index, image in enumerate(encoded):
        paths.append(tmp_path / f"image{index}.jpg")
        paths[-1].write_bytes(image)
    result = subprocess.run(
        [
            KERAS_PREACT,
            "query",
            "--server",
            client.url,
            "--model",
            "cifar10_resnet20",
            "--top-k",
            "2",
            *map(str, paths),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    expected = expected_outputs(network, normalize(decoded(encoded), CIFAR), CIFAR_CLASSES, 2)
    for path, line, classes, scores in zip(paths, result.stdout.splitlines(), expected["classes"], expected["scores"]):
        assert line == f"{path}: {classes[0]} {scores[0]:.1%}, {classes[1]} {scores[1]:.1%}"


def test_query_without_a_server_is_a_clear_error(tmp_path):
    image = tmp_path / "image.jpg"
    image.write_bytes(b"\xff\xd8")
    result = subprocess.run(
        [KERAS_PREACT, "query", "--server", f"http://127.0.0.1:{free_port()}", "--model", "m", str(image)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2 and "No server answers at" in result.stderr


def serve_command(*arguments):
    return subprocess.run(
        [KERAS_PREACT, "serve", *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )


def test_serve_refuses_a_missing_model_or_a_busy_port_before_tensorflow_loads(tmp_path):
    """Options, folder and port are checked before TensorFlow loads (here it cannot): a line each."""
    hidden = os.path.join(ROOT, "tests", "without_tensorflow")
    environment = {**os.environ, "PYTHONPATH": hidden, "KERAS_BACKEND": "tensorflow"}

    def serve(*arguments):
        return subprocess.run(
            [KERAS_PREACT, "serve", *arguments], cwd=ROOT, capture_output=True, text=True, timeout=120, env=environment
        )

    missing = serve(str(tmp_path / "nowhere"))
    assert (missing.returncode, missing.stdout) == (2, "")
    assert missing.stderr == (
        f"error: No complete version folder with a SavedModel (<directory>/<number>/saved_model.pb and metadata.json) "
        f"in {tmp_path / 'nowhere'}. Export one with `keras-preact export`. Received: {str(tmp_path / 'nowhere')!r}\n"
    )
    version = tmp_path / "model" / "1"
    version.mkdir(parents=True)
    for name in ("saved_model.pb", "metadata.json", "variables/variables.index"):  # a SavedModel's names
        (version / name).parent.mkdir(exist_ok=True)
        (version / name).write_text("{}")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        taken = serve(str(tmp_path / "model"), "--port", str(port))
    assert (taken.returncode, taken.stdout) == (2, "")
    assert taken.stderr.startswith(f"error: Cannot listen on 127.0.0.1:{port}: Address already in use")
    assert len(taken.stderr.splitlines()) == 1


def test_serve_start_errors_name_the_port_or_file(served, tmp_path):
    _, client, _, directory = served
    result = serve_command(str(directory), "--port", "99999")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "error: port must be an integer from 0 (any free port) to 65535. Received: port=99999" in result.stderr

    result = serve_command(str(directory), "--max-in-flight", "0")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "error: max_in_flight must be a positive integer. Received: max_in_flight=0" in result.stderr

    result = serve_command(str(directory), "--max-body-memory", "0")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "error: max_body_memory must be a positive integer (mebibytes). Received: max_body_memory=0" in result.stderr

    busy = int(client.url.rsplit(":", 1)[1])  # the fixture's server listens there
    result = serve_command(str(directory), "--port", str(busy))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"error: Cannot listen on 127.0.0.1:{busy}: Address already in use" in result.stderr

    damaged = tmp_path / "damaged"
    shutil.copytree(directory, damaged)
    graph = damaged / "1" / "saved_model.pb"
    graph.write_bytes(graph.read_bytes()[:5000])
    result = serve_command(str(damaged), "--port", str(free_port()), "--runtime", "tensorflow")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        f"error: Could not load the SavedModel {damaged / '1'} (a truncated or corrupt saved_model.pb" in result.stderr
    )


def truncated_jpeg(pixels):
    return jpegs(pixels[:1])[0][:200]


def with_leaf(nested, leaf):
    """`nested` (lists) with its first number replaced by `leaf`."""
    innermost = nested
    while isinstance(innermost[0], list):
        innermost = innermost[0]
    innermost[0] = leaf
    return nested


@pytest.mark.parametrize(
    "path, body, status, message",
    [
        (
            ":predict",
            lambda pixels: {"instances": [b64(b"not an image at all")]},
            400,
            r"^Could not decode the image bytes \(JPEG, PNG, GIF or BMP expected\): instance 0 \(19 bytes\): "
            r"Unknown image file format",
        ),
        (
            ":predict",
            lambda pixels: {"instances": [b64(jpegs(pixels[:1])[0]), b64(truncated_jpeg(pixels))]},
            400,
            r"^Could not decode the image bytes .*: instance 1 \(200 bytes\): ",
        ),
        (
            ":predict",
            lambda pixels: {"instances": [{"b64": "%%% not base64"}]},
            400,
            r"^Instance 0 of 'images': invalid base64",
        ),
        (
            ":predict",
            lambda pixels: {"instances": [[1, 2, 3]]},
            400,
            r"^Instance 0 of 'images' must be \{\"b64\": \"<base64 of the image file>\"\}. Received: \[1, 2, 3\]",
        ),
        (
            ":predict",
            lambda pixels: {"signature_name": "predict_pixels", "instances": pixels[:2, :16].tolist()},
            400,
            r"^Input 'pixels' must have shape \[batch, 32, 32, 3\]. Received: shape \(2, 16, 32, 3\)",
        ),
        (
            ":predict",
            lambda pixels: {"signature_name": "predict_pixels", "instances": (pixels[:1] + 300.0).tolist()},
            400,
            r"^Input 'pixels' holds uint8 pixels: integers from 0 to 255",
        ),
        (
            ":predict",
            lambda pixels: {"signature_name": "predict_pixels", "instances": with_leaf(pixels[:1].tolist(), "12")},
            400,
            r"^Input 'pixels' must be a rectangular array of numbers of shape \[batch, 32, 32, 3\]. Received: \"12\"$",
        ),
        (
            ":predict",
            lambda pixels: {"signature_name": "predict_pixels", "instances": with_leaf(pixels[:1].tolist(), True)},
            400,
            r"^Input 'pixels' must be a rectangular array of numbers of shape \[batch, 32, 32, 3\]. Received: true$",
        ),
        (
            ":predict",
            lambda pixels: {"signature_name": "predict_pixels", "instances": with_leaf(pixels[:1].tolist(), 10**309)},
            400,
            r"^Input 'pixels' holds uint8 pixels: integers from 0 to 255",
        ),
        (
            ":predict",
            lambda pixels: {
                "signature_name": "predict_normalized",
                "instances": with_leaf(np.zeros((1, 32, 32, 3)).tolist(), -(10**309)),
            },
            400,
            r"^Input 'normalized' holds a value too large for float32 \(at most 3.403e\+38\)",
        ),
        (
            ":predict",
            lambda pixels: {"signature_name": "classify", "instances": []},
            400,
            r"^Unknown signature_name. Choose one of \['predict_normalized', 'predict_pixels', 'serving_default'\]. "
            r"Received: \"classify\"",
        ),
        (":predict", lambda pixels: b'{"instances": [', 400, r"^The request body is not valid JSON"),
        (":predict", lambda pixels: [1, 2], 400, r"^The request must be a JSON object. Received: list"),
        (
            ":predict",
            lambda pixels: {"examples": []},
            400,
            r"^The request needs exactly one of 'instances' \(row format\) or 'inputs' \(columnar\)",
        ),
        (
            # 50,001 keys (600 KB): the error names eight, in a few hundred bytes.
            ":predict",
            lambda pixels: {"instanzes": [], **{f"q{index}": 1 for index in range(50_000)}},
            400,
            r"^The request needs exactly one of .* Received keys: \[\"instanzes\", \"q0\", \"q1\", \"q10\", "
            r"\"q100\", \"q1000\", \"q10000\", \"q10001\", and 49,993 more\]$",
        ),
        (":predict", lambda pixels: {"instances": []}, 400, r"^Input 'images' must be a non-empty list"),
        (
            ":predict",
            lambda pixels: {"instances": [b64(jpegs(pixels[:1])[0])] * (MAX_BATCH + 1)},
            400,
            rf"^Too many instances: this server takes at most {MAX_BATCH} per request \(--max-batch\). "
            rf"Received: {MAX_BATCH + 1}",
        ),
        (
            "/versions/7:predict",
            lambda pixels: {"instances": []},
            404,
            r"^Servable not found for request: Specific\(cifar10_resnet20, 7\)",
        ),
        (
            "/versions/" + "1" * 5000 + ":predict",
            lambda pixels: {"instances": []},
            404,
            r"^Servable not found for request: Specific\(cifar10_resnet20, 1111",
        ),
        (
            ":predict",
            lambda pixels: {"signature_name": ["serving_default"], "instances": []},
            400,
            r"^Unknown signature_name. .* Received: \[\"serving_default\"\]",
        ),
        (
            ":predict",
            lambda pixels: {"signature_name": {"a": 1}, "instances": []},
            400,
            r"^Unknown signature_name. .* Received: \{\"a\": 1\}",
        ),
        (":predict", lambda pixels: b"[" * 100_000 + b"]" * 100_000, 400, r"^The request body is nested too deeply"),
        (
            ":predict",
            lambda pixels: b'{"instances": [' + b"7" * 5000 + b"]}",
            400,
            r"^The request body is not valid JSON: Exceeds the limit \(4300 digits\)",
        ),
        (
            ":predict",
            lambda pixels: {
                "signature_name": "predict_normalized",
                "instances": np.full((1, 32, 32, 3), 1e39).tolist(),
            },
            400,
            r"^Input 'normalized' holds a value too large for float32 \(at most 3.403e\+38\)",
        ),
        (
            ":predict",
            lambda pixels: {
                "signature_name": "predict_normalized",
                "instances": np.full((1, 32, 32, 3), 3e38).tolist(),
            },
            400,
            r"^The network's outputs are not finite \(NaN or infinite\) for instances \[0\]",
        ),
    ],
    ids=[
        "corrupt bytes",
        "truncated JPEG",
        "bad base64",
        "not b64",
        "wrong shape",
        "out of range",
        "a string as a pixel",
        "a bool as a pixel",
        "a 310-digit pixel",
        "a 310-digit normalized value",
        "unknown signature",
        "malformed JSON",
        "not an object",
        "no instances",
        "50,001 keys",
        "empty batch",
        "batch too large",
        "unknown version",
        "5,000-digit version",
        "list signature",
        "dict signature",
        "100,000-deep JSON",
        "5,000-digit number",
        "too large for float32",
        "non-finite outputs",
    ],
)
def test_bad_requests_get_a_clear_error_and_the_server_keeps_serving(served, path, body, status, message):
    _, client, pixels, _ = served
    answer_status, answer = client.post(f"/v1/models/cifar10_resnet20{path}", body(pixels))
    assert answer_status == status and sorted(answer) == ["error"]
    assert re.search(message, answer["error"]), answer["error"]
    assert client.get("/v1/models/cifar10_resnet20")[0] == 200
    status, response = client.post("/v1/models/cifar10_resnet20:predict", {"instances": [b64(jpegs(pixels[:1])[0])]})
    assert status == 200 and len(response["predictions"]) == 1


def raw_exchange(port, request, timeout=60):
    """Sends raw bytes on one connection and reads until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        connection.sendall(request)
        received = b""
        while chunk := connection.recv(65536):
            received += chunk
    return received


@pytest.mark.parametrize(
    "target, status, answer",
    [
        # Absolute form (RFC 9112, section 3.2.2): routed by its path.
        ("http://127.0.0.1/v1/models/cifar10_resnet20", 200, '"state":"AVAILABLE"'),
        ("HTTP://localhost:1/v1/models/cifar10_resnet20/metadata", 200, '"signature_def"'),
        # An encoded "/" is part of its segment: a model's name, never a separator.
        ("/v1/models/cifar10%2Fresnet20", 404, "No such resource: GET /v1/models/cifar10%2Fresnet20. "),
        (
            "/v1/models/cifar10_resnet20%2Fmetadata",
            404,
            "No such resource: GET /v1/models/cifar10_resnet20%2Fmetadata. ",
        ),
        ("/v1/models/cifar10%5Fresnet20", 200, '"state":"AVAILABLE"'),  # other escapes decode
    ],
)
def test_a_target_is_routed_by_its_path_with_an_encoded_slash_kept_in_its_segment(served, target, status, answer):
    _, client, _, _ = served
    port = int(client.url.rsplit(":", 1)[1])
    received = raw_exchange(port, f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    assert received.startswith(b"HTTP/1.1 %d " % status), received[:300]
    assert answer.encode() in received.split(b"\r\n\r\n", 1)[1]


@pytest.mark.parametrize("path", ["/v1/models/cifar10_resnet20/", "/v1/models/cifar10_resnet20/metadata/"])
def test_a_trailing_slash_is_a_404_not_a_redirect_to_the_clients_host(served, path):
    _, client, _, _ = served
    status, answer = client.get(path)
    assert status == 404 and answer["error"].startswith(f"No such resource: GET {path}. This server serves")


SMUGGLED = b"GET /v1/models/cifar10_resnet20 HTTP/1.1\r\nHost: x\r\n\r\n"
PREDICT = b"POST /v1/models/cifar10_resnet20:predict HTTP/1.1\r\n"


@pytest.mark.parametrize(
    "head, body, status, message",
    [
        (
            PREDICT + b"Transfer-Encoding: chunked\r\n",
            b"%x\r\n%s\r\n0\r\n\r\n" % (len(SMUGGLED), SMUGGLED),
            400,
            b"The request body is not valid JSON",
        ),
        (PREDICT + b"Content-Length: 0\r\n", b"", 400, b"The request body is not valid JSON"),
        (
            b"POST /v1/models/nobody:predict HTTP/1.1\r\nContent-Length: %d\r\n" % len(SMUGGLED),
            SMUGGLED,
            404,
            b"No such resource",
        ),
        (PREDICT + b"Content-Length: 999999999999\r\n", SMUGGLED, 413, b"The request body is too large"),
        (
            b"GET /v1/models/cifar10_resnet20/" + b"a" * 20_000 + b" HTTP/1.1\r\n",
            b"",
            414,
            b"The request line is too long: at most 16384 bytes",
        ),
        (
            b"GET /v1/models/cifar10_resnet20 HTTP/1.1\r\n" + b"X-Padding: abc\r\n" * 2000,
            b"",
            431,
            b"The request's headers are too large: at most 16384 bytes",
        ),
    ],
    ids=["chunked", "no length", "404 with a body", "413", "414", "431"],
)
def test_errors_of_the_application_are_json_and_nothing_is_smuggled(served, head, body, status, message):
    """Every error of the application is TF Serving's JSON. A request hidden in a body is
    never answered (no desync); a request refused before its body is read whole is answered
    once and its connection closed, so that a request sent after it is never answered either;
    after a body read whole, the next request is answered as any kept-alive one."""
    _, client, _, _ = served
    port = int(client.url.rsplit(":", 1)[1])
    received = raw_exchange(port, head + b"Host: x\r\n\r\n" + body + SMUGGLED)
    assert received.startswith(b"HTTP/1.1 %d " % status), received[:200]
    answers = re.split(rb"(?=HTTP/1\.1 \d{3} )", received)[1:]
    head, answer = answers[0].split(b"\r\n\r\n", 1)
    assert b"content-type: application/json" in head.lower()
    assert message in json.loads(answer)["error"].encode()
    if b"connection: close" in head.lower():
        assert len(answers) == 1, received
    else:  # the body was read whole: the request after it is the client's next one
        assert status == 400 and len(answers) == 2 and answers[1].startswith(b"HTTP/1.1 200 "), received


@pytest.mark.parametrize(
    "head, body",
    [
        (PREDICT + b"Content-Length: -5\r\n", b"x" * 1000),
        (PREDICT + b"Transfer-Encoding: chunked\r\n", b"zz\r\n"),
        (PREDICT.replace(b"HTTP/1.1", b"HTTP/1.0") + b"Transfer-Encoding: chunked\r\n", b"3\r\nabc\r\n0\r\n\r\n"),
        (b"GARBAGE\r\n", b""),
    ],
    ids=["negative length", "malformed chunk", "HTTP/1.0 chunked", "not HTTP"],
)
def test_requests_that_break_http_are_refused_by_the_server_and_nothing_is_smuggled(served, head, body):
    """Framing HTTP/1.1 does not allow is the server's to refuse (Hypercorn on h11: 400 with an
    empty body, docs/serving.md): answered once, the connection closed, nothing after it answered."""
    _, client, _, _ = served
    received = raw_exchange(int(client.url.rsplit(":", 1)[1]), head + b"Host: x\r\n\r\n" + body + SMUGGLED)
    assert received.startswith(b"HTTP/1.1 400 "), received[:200]
    assert len(re.findall(rb"HTTP/1\.1 \d{3} ", received)) == 1, received
    assert b"connection: close" in received.split(b"\r\n\r\n", 1)[0].lower()


def test_a_head_that_arrives_in_pieces_is_bounded_too(served):
    """A request line or headers past 16 KiB that never end are refused before they end (the
    server's 431, empty) and the connection closed."""
    port = int(served[1].url.rsplit(":", 1)[1])
    for request in (b"GET /" + b"a" * 20_000, b"GET / HTTP/1.1\r\n" + b"X-A: b\r\n" * 4000):
        with socket.create_connection(("127.0.0.1", port), timeout=60) as connection:
            with contextlib.suppress(BrokenPipeError):  # the server may close before the last piece
                for start in range(0, len(request), 4096):  # each piece read apart
                    connection.sendall(request[start : start + 4096])
                    time.sleep(0.05)
            answer = connection.recv(65536)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]


def test_unknown_model_and_routes_are_not_found(served):
    _, client, _, _ = served
    status, answer = client.get("/v1/models/resnet50")
    assert status == 404 and "This server serves /v1/models/cifar10_resnet20" in answer["error"]
    assert client.post("/v1/models/cifar10_resnet20:classify", {"instances": []})[0] == 404
    assert client.get("/v1/models/cifar10_resnet20:predict")[0] == 405
    assert client.post("/v1/models/cifar10_resnet20/metadata", {})[0] == 405


def test_concurrent_clients_are_all_answered_correctly(served):
    """8 clients x 50 requests at once, each request 1-3 different images: every answer right."""
    network, client, _, _ = served
    pixels = random_pixels(24, CIFAR, seed=4)
    encoded = jpegs(pixels)
    expected = expected_outputs(network, normalize(decoded(encoded), CIFAR), CIFAR_CLASSES, 5)

    def requests(worker):
        wrong = 0
        for request in range(50):
            rows = [(worker * 50 + request + offset) % len(encoded) for offset in range(1 + request % 3)]
            status, response = client.post(
                "/v1/models/cifar10_resnet20:predict", {"instances": [b64(encoded[row]) for row in rows]}
            )
            assert status == 200, response
            for row, prediction in zip(rows, response["predictions"], strict=True):
                wrong += prediction["classes"] != expected["classes"][row].tolist()
                np.testing.assert_allclose(prediction["logits"], expected["logits"][row], atol=1e-4)
        return wrong

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(requests, range(8))) == [0] * 8


def held_connection(port, request):
    connection = socket.create_connection(("127.0.0.1", port), timeout=30)
    connection.sendall(request)
    return connection


def read_until_closed(connection):
    received = b""
    while chunk := connection.recv(65536):
        received += chunk
    connection.close()
    return received


def test_slow_clients_are_cut_off_at_the_request_timeout_and_hold_nothing(served, limited):
    """50 connections that never finish their head, one that sends its head a byte every 0.2 s,
    one that never finishes its body and one that sends nothing: other clients are answered
    meanwhile; the heads and the silent one are closed at the 4 s timeout (the server's, which
    no byte restarts), the body gets a 408 in TF Serving's JSON 4 s after its head."""
    _, _, pixels, _ = served
    client = Client(f"http://127.0.0.1:{limited}")
    started = time.monotonic()
    heads = [held_connection(limited, PREDICT + b"Host: x\r\n") for _ in range(50)]
    trickled = held_connection(limited, b"P")
    status, response = client.post("/v1/models/cifar10_resnet20:predict", {"instances": [b64(jpegs(pixels[:1])[0])]})
    assert status == 200 and len(response["predictions"]) == 1
    body = held_connection(limited, PREDICT + b"Host: x\r\nContent-Length: 1000\r\n\r\n{")
    silent = held_connection(limited, b"")
    assert client.get("/v1/models/cifar10_resnet20")[0] == 200
    trickled.settimeout(0.2)
    closed = None
    for byte in (PREDICT[1:] + b"X-Slow: " + b"a" * 1000).decode():
        try:
            trickled.send(byte.encode())
            if trickled.recv(65536) == b"":
                closed = time.monotonic() - started
                break
        except TimeoutError:
            continue
        except OSError:
            closed = time.monotonic() - started
            break
    assert closed is not None and closed < 4 + 3, closed
    for connection in [*heads, silent]:
        assert b"HTTP/1.1 200" not in read_until_closed(connection)
    received = read_until_closed(body)
    assert received.startswith(b"HTTP/1.1 408 "), received[:200]
    assert json.loads(received.split(b"\r\n\r\n", 1)[1]) == {
        "error": "The request body did not arrive whole within 4 s (--request-timeout)."
    }
    assert time.monotonic() - started < 4 + 4 + 5


def test_past_max_in_flight_is_a_503_with_retry_after_never_a_reset(served, limited):
    """One request in flight at most, 12 clients at once: the others are told to retry
    (503, Retry-After, TF Serving's JSON), every answered one is right, none is reset."""
    network, _, pixels, _ = served
    encoded = jpegs(pixels)
    expected = expected_outputs(network, normalize(decoded(encoded), CIFAR), CIFAR_CLASSES, 5)
    url = f"http://127.0.0.1:{limited}/v1/models/cifar10_resnet20:predict"

    def request(row):
        body = json.dumps({"instances": [b64(encoded[row % len(encoded)])] * 8}).encode()
        try:
            with urllib.request.urlopen(urllib.request.Request(url, body), timeout=60) as response:
                assert_prediction_matches(json.load(response)["predictions"][7], expected, row % len(encoded))
                return 200
        except urllib.error.HTTPError as refused:
            assert refused.headers["Retry-After"] == "1"
            assert json.load(refused) == {
                "error": "The server is busy: 1 requests are in flight (--max-in-flight). Retry after 1 s."
            }
            return refused.code

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        statuses = list(pool.map(request, range(48)))
    assert set(statuses) == {200, 503}, statuses


def png(width, height):
    encoded = io.BytesIO()
    Image.new("L", (width, height)).save(encoded, format="PNG")
    return encoded.getvalue()


def png_header(width, height):
    """A PNG's signature, header and an empty data chunk: all an attacker needs to claim a size."""

    def chunk(kind, data=b""):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + chunk(b"IDAT")


@pytest.mark.parametrize(
    "images, message",
    [
        (
            lambda: [png(5000, 5000)],
            "Instance 0 of 'images' is too large: 5000 x 5000 pixels; this server decodes at most 16,777,216 pixels an "
            "image.",
        ),
        (
            lambda: [png(4000, 3800)] * 5,
            "The request's images are too large together: 76,000,000 pixels; this server decodes at most 67,108,864 "
            "pixels a request.",
        ),
        (
            lambda: [png(32, 32), png_header(10_000, 10_000)],
            "Instance 1 of 'images' is too large: 10000 x 10000 pixels; this server decodes at most 16,777,216 pixels an "
            "image.",
        ),
        (
            lambda: [png_header(100_000, 100_000)],
            "Instance 0 of 'images' is too large: Image size (10000000000 pixels) "
            "exceeds limit of 178956970 pixels, could be decompression bomb DOS attack.",
        ),
    ],
    ids=["one image", "the request's images", "a header alone", "a header past Pillow's own bound"],
)
def test_image_bombs_are_refused_from_their_headers_before_decoding(served, images, message):
    _, client, _, _ = served
    status, answer = client.post(
        "/v1/models/cifar10_resnet20:predict", {"instances": [b64(image) for image in images()]}
    )
    assert (status, answer) == (413, {"error": message})


def test_requests_batched_together_are_answered_each_its_own(served):
    """Good and undecodable requests from 8 clients at once: the server runs waiting requests
    as one batch, and each gets its own answer (a bad image fails its request alone)."""
    network, client, pixels, _ = served
    encoded = jpegs(pixels)
    expected = expected_outputs(network, normalize(decoded(encoded), CIFAR), CIFAR_CLASSES, 5)

    def requests(worker):
        for request in range(12):
            row = (worker + request) % len(encoded)
            if request % 3 == 2:
                status, answer = client.post(
                    "/v1/models/cifar10_resnet20:predict", {"instances": [b64(encoded[row][:300])]}
                )
                assert status == 400 and answer["error"].startswith("Could not decode the image bytes"), answer
            else:
                status, answer = client.post("/v1/models/cifar10_resnet20:predict", {"instances": [b64(encoded[row])]})
                assert status == 200, answer
                assert_prediction_matches(answer["predictions"][0], expected, row)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(requests, range(8)))


class BlockingModel:
    """A stand-in for ModelServer whose calls wait for `release`, and record their batches."""

    max_batch = 8
    image_pixels = 32 * 32

    def __init__(self):
        self.release, self.calls = threading.Event(), []

    def infer(self, requests):
        self.calls.append([(request.signature, len(request)) for request in requests])
        assert self.release.wait(timeout=60)
        return [f"answer to {request.values[0]}" for request in requests]


@pytest.mark.parametrize(
    "batching, calls",
    [
        (True, [[("a", 1)], [("a", 1)], [("a", 3), ("a", 4), ("a", 1)], [("b", 2)], [("a", 2)]]),
        (False, [[("a", 1)], [("a", 1)], [("a", 3)], [("a", 4)], [("b", 2)], [("a", 2)], [("a", 1)]]),
    ],
    ids=["batching", "no batching"],
)
def test_requests_that_wait_while_every_thread_is_busy_run_as_one_batch(batching, calls):
    """Two threads busy; five requests wait. With batching, the next call takes the first
    waiting request and every later one of its signature that fits in max_batch (3 + 4 + 1);
    a request of another signature, or one that does not fit, waits for the next call."""
    model = BlockingModel()
    sizes = [("a", 1), ("a", 1), ("a", 3), ("a", 4), ("b", 2), ("a", 2), ("a", 1)]

    async def run():
        batcher = Batcher(model, threads=2, batching=batching)
        requests = [
            Parsed(signature, "images", [index] * size, row_format=True)
            for index, (signature, size) in enumerate(sizes)
        ]
        answers = [asyncio.ensure_future(batcher.infer(request)) for request in requests]
        await asyncio.sleep(0.2)  # every request waits or runs
        model.release.set()
        return await asyncio.gather(*answers)

    assert asyncio.run(run()) == [f"answer to {index}" for index in range(len(sizes))]
    assert model.calls == calls


def test_every_runtime_serves_the_newest_complete_version(exported, tmp_path):
    """A version without metadata.json or with half its files (being copied in) is passed over;
    `auto` serves the newest complete version, with the runtime whose files it has."""
    _, _, directory = exported
    models = tmp_path / "cifar10_resnet20"
    shutil.copytree(directory, models)
    shutil.copytree(models / "1", models / "2")
    (models / "2" / "metadata.json").unlink()
    shutil.copytree(models / "1", models / "3")
    (models / "3" / contract.onnx_file("predict_pixels", "float32")).unlink()
    (models / "3" / "variables" / "variables.index").unlink()
    for runtime in RUNTIMES:
        assert ModelServer(str(models), runtime=runtime).version == 1
    shutil.copytree(models / "1", models / "4")
    shutil.rmtree(models / "4" / "onnx")
    assert not onnx_servable(str(models))
    assert ModelServer(str(models), runtime="onnxruntime").version == 1
    assert ModelServer(str(models), runtime="tensorflow").version == 4
    shutil.copytree(models / "1", models / "5")
    assert onnx_servable(str(models))


def test_onnxruntime_answers_real_jpegs_as_the_saved_model_does(exported, cifar_folder, tmp_path):
    """The bytes path of the onnxruntime runtime (TensorFlow's decoding, then ONNX) against
    the SavedModel's graph on 12 CIFAR-10 test JPEGs: same classes, probabilities to 1e-5."""
    _, _, directory = exported
    files = [
        os.path.join(cifar_folder, "test", name, sorted(os.listdir(os.path.join(cifar_folder, "test", name)))[0])
        for name in CIFAR_CLASSES
    ]
    files += [
        os.path.join(cifar_folder, "test", "cat", name)
        for name in sorted(os.listdir(os.path.join(cifar_folder, "test", "cat")))[1:3]
    ]
    encoded = []
    for file in files:
        with open(file, "rb") as image:
            encoded.append(b64(image.read()))
    body = json.dumps({"instances": encoded}).encode()
    answers = {
        runtime: ModelServer(str(directory), runtime=runtime).predict(body)["predictions"]
        for runtime in tuple(RUNTIMES)
    }
    assert len(answers["onnxruntime"]) == 12
    for saved_model, onnx in zip(answers["tensorflow"], answers["onnxruntime"], strict=True):
        assert onnx["classes"] == saved_model["classes"] and onnx["class_ids"] == saved_model["class_ids"]
        np.testing.assert_allclose(onnx["probabilities"], saved_model["probabilities"], atol=1e-5)
        np.testing.assert_allclose(onnx["scores"], saved_model["scores"], atol=1e-5)

    saved_model_only = tmp_path / "cifar10_resnet20"
    shutil.copytree(directory, saved_model_only)
    shutil.rmtree(saved_model_only / "1" / "onnx")
    with pytest.raises(
        FileNotFoundError,
        match=r"^No complete version folder with ONNX models \(<directory>/<number>/"
        r"onnx/predict_normalized.onnx and metadata.json\) in .*export --format onnx \(or all\)",
    ):
        ModelServer(str(saved_model_only), runtime="onnxruntime")
    assert not onnx_servable(str(saved_model_only)) and onnx_servable(str(directory))


@pytest.mark.parametrize("runtime", tuple(RUNTIMES))
def test_sigterm_answers_the_requests_under_way_then_503_and_exits(exported, runtime):
    """Told to stop, the server closes its idle connections at once, answers the request whose
    body ends after the signal, answers 503 (TF Serving's JSON) to the one still arriving when
    the 5 s grace ends, and exits within a few seconds of it."""
    _, pixels, directory = exported
    server, port = start_server(directory, "--runtime", runtime, "--request-timeout", "60")
    body = json.dumps({"instances": [b64(jpegs(pixels[:1])[0])]}).encode()
    head = PREDICT + b"Host: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    finishing, stuck = (held_connection(port, head + body[:10]) for _ in range(2))
    idle = held_connection(port, b"")
    time.sleep(0.5)
    # On a loaded machine the server may not have read the heads yet: a head unread at the signal
    # is an idle connection's, closed at once, and the body sent after it then meets a reset.
    wait_until_read(port)
    started = time.monotonic()
    server.terminate()
    assert read_until_closed(idle) == b"" and time.monotonic() - started < 2
    finishing.sendall(body[10:])
    assert read_until_closed(finishing).startswith(b"HTTP/1.1 200 ")
    received = read_until_closed(stuck)
    assert received.startswith(b"HTTP/1.1 503 "), received[:300]
    assert json.loads(received.split(b"\r\n\r\n", 1)[1]) == {
        "error": "The server is stopping and could not answer in time: send the request again."
    }
    assert 5 <= time.monotonic() - started < 5 + 2
    server.wait(timeout=10)
    # Within a second of the grace (and a second of this machine's load), whatever still runs.
    assert time.monotonic() - started < 5 + 2 and server.returncode == 0, server.stderr.read()[-2000:]


def wait_until_read(port, seconds=30):
    """Waits until the server listening on `port` has read every byte its connections were sent
    (Linux's /proc/net/tcp: each connection's receive queue empty on the server's side)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with open("/proc/net/tcp") as table:
            rows = [line.split() for line in table.read().splitlines()[1:]]
        waiting = [row for row in rows if int(row[1].split(":")[1], 16) == port and int(row[4].split(":")[1], 16)]
        if not waiting:
            return
        time.sleep(0.05)
    raise AssertionError(f"the server on port {port} did not read what its clients sent within {seconds} s")


METADATA = b"GET /v1/models/cifar10_resnet20/metadata HTTP/1.1\r\nHost: x\r\n\r\n"


def resident_mebibytes(pid):
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads resident memory from Linux's /proc")
@pytest.mark.parametrize("runtime", tuple(RUNTIMES))
def test_clients_that_never_read_or_flood_hold_bounded_memory_and_no_one_else(exported, runtime):
    """4 connections pipelining 10,000 requests each and reading nothing: the server stops
    reading them (each answer waits for its socket to drain), grows by less than 64 MiB and
    answers another client meanwhile. 1,000 connections opened at once and closed: the server
    answers within 3 s after."""
    _, _, directory = exported
    server, port = start_server(directory, "--runtime", runtime)
    try:
        client = Client(f"http://127.0.0.1:{port}")
        assert client.get("/v1/models/cifar10_resnet20")[0] == 200
        before = resident_mebibytes(server.pid)
        readers = []
        for _ in range(4):
            connection = socket.socket()
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            connection.connect(("127.0.0.1", port))
            connection.settimeout(2)
            with contextlib.suppress(TimeoutError):  # the server stopped reading
                connection.sendall(METADATA * 10_000)  # 3 KB answers: 116 MiB, were they all made
            readers.append(connection)
        time.sleep(5)
        assert client.get("/v1/models/cifar10_resnet20")[0] == 200
        grown = resident_mebibytes(server.pid) - before
        answer = len(raw_exchange(port, METADATA.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")))
        print(f"{answer} bytes an answer; resident memory grew {grown:.1f} MiB")
        assert grown < 64
        for connection in readers:
            connection.close()
        flood = []
        for _ in range(1000):
            connection = socket.socket()
            connection.setblocking(False)
            connection.connect_ex(("127.0.0.1", port))
            flood.append(connection)
        time.sleep(2)
        for connection in flood:
            connection.close()
        started = time.monotonic()
        assert client.get("/v1/models/cifar10_resnet20")[0] == 200 and time.monotonic() - started < 3
    finally:
        stop_server(server)
