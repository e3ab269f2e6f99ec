"""The onnxruntime server without TensorFlow or Keras: Pillow and NumPy decode as the
SavedModel does, and its answers equal the TensorFlow runtime's."""

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_preact_training.data import images, input_tensorflow
from keras_preact_training.export.contract import Preprocessing
from keras_preact_training.serving.model import ModelServer
from tests.test_export import CIFAR_CLASSES
from tests.test_serving import ROOT, Client, b64, export_resnet20, free_port, stop_server

pytestmark = pytest.mark.tensorflow

# Imports that fail in the server's process: neither TensorFlow nor Keras nor another backend.
BLOCKED = ("tensorflow", "keras", "jax", "torch", "tf2onnx")
BLOCKER = f"""
import importlib.abc, sys
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError(f"{{name}} is blocked: the onnxruntime server must not import it")
sys.meta_path.insert(0, Blocked())
from keras_preact_training.cli import main
sys.exit(main(sys.argv[1:]))
"""
# The onnxruntime runtime's answers against the TensorFlow runtime's: float32 rounding of
# two runtimes over the same pixels.
PROBABILITY_TOLERANCE = 1e-4


def encoded(pixels, image_format, **options):
    stream = io.BytesIO()
    image = Image.fromarray(pixels)
    (image.quantize(64) if image_format == "palette PNG" else image).save(
        stream, format="PNG" if image_format == "palette PNG" else image_format, **options
    )
    return stream.getvalue()


def image_battery(seed=0):
    """Every format and channel layout a client may send, at odd sizes: {name: bytes}."""
    rng = np.random.default_rng(seed)
    rgb, rgba = rng.integers(0, 256, (37, 53, 3), np.uint8), rng.integers(0, 256, (41, 29, 4), np.uint8)
    grey = rng.integers(0, 256, (33, 47), np.uint8)
    return {
        "JPEG RGB": encoded(rgb, "JPEG", quality=75),
        "JPEG grey": encoded(grey, "JPEG"),
        "PNG RGB": encoded(rgb, "PNG"),
        "PNG RGBA": encoded(rgba, "PNG"),
        "PNG grey": encoded(grey, "PNG"),
        "PNG grey and alpha": encoded(np.asarray(Image.fromarray(rgba).convert("LA")), "PNG"),
        "PNG palette": encoded(rgb, "palette PNG"),
        "PNG 16-bit grey": encoded(rng.integers(0, 65536, (35, 31), np.uint16), "PNG"),
        "BMP RGB": encoded(rgb, "BMP"),
        "BMP grey": encoded(grey, "BMP"),
        "BMP RGBA": encoded(rgba, "BMP"),
        "JPEG 640 x 480": encoded(rng.integers(0, 256, (480, 640, 3), np.uint8), "JPEG"),
        "GIF palette": encoded(rgb, "GIF"),
        "GIF grey": encoded(grey, "GIF"),
        "GIF with transparency": gif(rgb, transparency=0),
        "GIF animated": gif(rgb, save_all=True, append_images=[Image.fromarray(rgb[::-1]).quantize(16)]),
    }


def gif(pixels, **options):
    stream = io.BytesIO()
    Image.fromarray(pixels).quantize(16).save(stream, format="GIF", **options)
    return stream.getvalue()


@pytest.mark.parametrize("channels", [3, 1])
@pytest.mark.parametrize("size, crop", [(32, "resize"), (37, "resize"), (24, "central_crop")])
def test_pillow_and_numpy_preprocess_every_format_as_the_saved_model_does(channels, size, crop):
    """`images.decode` and `images.crop` against `input_tensorflow.decode_encoded` (TensorFlow's
    decoders and resize): the same pixels, every format and channel layout, resized or not."""
    preprocessing = Preprocessing(size, channels, (0.0,) * channels, (1.0,) * channels, crop)
    for name, image in image_battery().items():
        expected = input_tensorflow.decode_encoded(preprocessing, tf.constant(image)).numpy()
        received = images.crop(images.decode(image, channels), preprocessing)
        assert received.dtype == np.float32 and received.shape == expected.shape, name
        np.testing.assert_allclose(received, expected, atol=1e-3, err_msg=name)


def test_the_decoder_of_a_damaged_image_says_why():
    with pytest.raises(ValueError, match=r"^instance 1 \(10 bytes\): UnidentifiedImageError: cannot identify"):
        images.preprocess(
            [encoded(np.zeros((4, 4, 3), np.uint8), "PNG"), b"not image!"], Preprocessing(4, 3, (0.0,) * 3, (1.0,) * 3)
        )


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export_resnet20(tmp_path_factory, seed=11)[2]


def predictions(model, encoded_images):
    body = json.dumps({"instances": [b64(image) for image in encoded_images]}).encode()
    return model.predict(body)["predictions"]


def assert_same_answers(received, expected):
    assert len(received) == len(expected)
    for onnx, saved_model in zip(received, expected, strict=True):
        assert onnx["classes"] == saved_model["classes"] and onnx["class_ids"] == saved_model["class_ids"]
        np.testing.assert_allclose(onnx["probabilities"], saved_model["probabilities"], atol=PROBABILITY_TOLERANCE)
        np.testing.assert_allclose(onnx["scores"], saved_model["scores"], atol=PROBABILITY_TOLERANCE)


def test_onnxruntime_answers_cifar_images_and_odd_sized_images_as_tensorflow_does(exported, cifar_folder):
    """100 CIFAR-10 test images (10 a class) and the battery of formats at odd sizes: the
    same classes, probabilities within 1e-4."""
    files = [
        os.path.join(cifar_folder, "test", name, file)
        for name in CIFAR_CLASSES
        for file in sorted(os.listdir(os.path.join(cifar_folder, "test", name)))[:10]
    ]
    cifar = []
    for file in files:
        with open(file, "rb") as image:
            cifar.append(image.read())
    odd = list(image_battery(seed=1).values())
    servers = {runtime: ModelServer(str(exported), runtime=runtime) for runtime in ("tensorflow", "onnxruntime")}
    for batch in [cifar[:50], cifar[50:], odd]:
        assert_same_answers(predictions(servers["onnxruntime"], batch), predictions(servers["tensorflow"], batch))


def test_the_onnxruntime_server_runs_where_tensorflow_and_keras_cannot_be_imported(exported):
    """`keras-preact serve --runtime onnxruntime` in a process where importing TensorFlow,
    Keras (or JAX, PyTorch, tf2onnx) fails: it starts, answers status, metadata and every
    signature as the TensorFlow runtime does, and refuses a corrupt image with a 400."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", BLOCKER, "serve", str(exported), "--port", str(port), "--runtime", "onnxruntime"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = server.stdout.readline()
        assert line.startswith(f"Serving cifar10_resnet20 version 1 ({exported / '1'}, onnxruntime)"), (
            line + server.stderr.read()[-3000:]
        )
        client = Client(f"http://127.0.0.1:{port}")
        reference = ModelServer(str(exported), runtime="tensorflow")
        path = "/v1/models/cifar10_resnet20"
        assert client.get(path) == (200, {**reference.status(), "runtime": "onnxruntime"})
        status, metadata = client.get(path + "/metadata")
        assert status == 200 and metadata == json.loads(json.dumps(reference.describe()))
        battery = list(image_battery(seed=2).values())
        status, answer = client.post(path + ":predict", {"instances": [b64(image) for image in battery]})
        assert status == 200, answer
        assert_same_answers(answer["predictions"], predictions(reference, battery))
        pixels = np.random.default_rng(3).integers(0, 256, (2, 32, 32, 3)).tolist()
        body = {"signature_name": "predict_pixels", "inputs": pixels}
        status, answer = client.post(path + ":predict", body)
        expected = reference.predict(json.dumps(body).encode())["outputs"]
        assert status == 200 and answer["outputs"]["classes"] == expected["classes"]
        np.testing.assert_allclose(
            answer["outputs"]["probabilities"], expected["probabilities"], atol=PROBABILITY_TOLERANCE
        )
        status, answer = client.post(path + ":predict", {"instances": [b64(battery[0][:200])]})
        assert status == 400 and answer["error"].startswith("Could not decode the image bytes"), answer
    finally:
        stop_server(server)
    assert "is blocked" not in server.stderr.read()
