"""`export --format litert`: `predict_pixels` as LiteRT models, run with LiteRT's own interpreter."""

import os
import sys

import numpy as np
import pytest

import keras_preact
from keras_preact import pretrained
from keras_preact_training import export
from keras_preact_training.export import contract, litert
from tests.test_export import BATCH_SIZES, CIFAR, CIFAR_CLASSES, calibrated, expected_outputs, normalize, random_pixels

pytest.importorskip(
    "ai_edge_litert", reason='LiteRT\'s interpreter is not installed: pip install "keras-preact[litert]"'
)
pytestmark = pytest.mark.tensorflow

# Probabilities of a float LiteRT model against the Keras network it computes: float32 rounding.
PROBABILITY_TOLERANCE = 1e-4


def exported_litert(network, tmp_path, **options):
    return export.export_saved_model(
        network, str(tmp_path / "model"), CIFAR_CLASSES, CIFAR, formats=("litert",), verbose=False, **options
    )


@pytest.mark.parametrize(
    "build",
    [
        *[
            lambda unit=unit: keras_preact.CifarResNet(20, unit=unit, input_shape=CIFAR.shape, classes=10)
            for unit in keras_preact.units.UNITS
        ],
        lambda: keras_preact.CifarResNet(29, "bottleneck", input_shape=CIFAR.shape, classes=10, scan_units=True),
        lambda: keras_preact.get_model(
            "resnet20_original", input_shape=CIFAR.shape, classes=10, classifier_activation=None
        ),
    ],
    ids=[*keras_preact.units.UNITS, "bottleneck ResNet-29 in loops", "original, logits"],
)
def test_the_float32_litert_model_equals_the_keras_model(tmp_path, build):
    pixels = random_pixels(8, CIFAR, seed=3)
    network = calibrated(build(), CIFAR, pixels)
    path = exported_litert(network, tmp_path)
    assert sorted(os.listdir(path)) == ["litert", "metadata.json"]  # no SavedModel asked for
    metadata = contract.read_metadata(path)
    assert metadata["formats"] == ["litert"]
    assert metadata["litert"] == dict(
        signature="predict_pixels",
        input="pixels: tf.uint8 [batch, 32, 32, 3], 0-255",
        output="probabilities",
        files={"float32": "litert/predict_pixels.float32.tflite"},
        sha256={"float32": pretrained.sha256(os.path.join(path, "litert", "predict_pixels.float32.tflite"))},
    )
    model = litert.LiteRTModel(os.path.join(path, metadata["litert"]["files"]["float32"]))
    for batch_size in (*BATCH_SIZES, 1):  # the interpreter resized back to one image
        expected = expected_outputs(network, normalize(pixels[:batch_size], CIFAR), CIFAR_CLASSES, 5)
        np.testing.assert_allclose(model(pixels[:batch_size]), expected["probabilities"], atol=PROBABILITY_TOLERANCE)


def test_a_model_that_is_not_of_pixels_is_refused(tmp_path):
    (tmp_path / "empty.tflite").write_bytes(b"")
    with pytest.raises(ValueError, match=r"^Could not load the LiteRT model .*empty.tflite"):
        litert.LiteRTModel(str(tmp_path / "empty.tflite"))


def test_a_missing_interpreter_is_named_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setitem(
        sys.modules, "ai_edge_litert", None
    )  # what `import ai_edge_litert` sees when it is not installed
    network = keras_preact.ResNet20(input_shape=CIFAR.shape, classes=10)
    with pytest.raises(
        ImportError,
        match=r"^LiteRT export needs LiteRT's interpreter \(ai-edge-litert\): pip install \"keras-preact\[litert\]\"$",
    ):
        exported_litert(network, tmp_path)
    assert not os.path.exists(tmp_path / "model")


def test_a_failed_export_leaves_nothing_behind(tmp_path, monkeypatch):
    """The SavedModel is written, then the LiteRT conversion fails: neither the version nor its
    partial folder remains."""

    def failing(*arguments, **options):
        raise RuntimeError("the converter stopped")

    monkeypatch.setattr(litert, "convert", failing)
    network = keras_preact.ResNet20(input_shape=CIFAR.shape, classes=10)
    with pytest.raises(RuntimeError, match="the converter stopped"):
        export.export_saved_model(
            network, str(tmp_path / "model"), CIFAR_CLASSES, CIFAR, formats=("saved_model", "litert"), verbose=False
        )
    assert os.listdir(tmp_path / "model") == []
