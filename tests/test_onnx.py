"""`export --format onnx|all`: the pixel signatures as ONNX models, run with onnxruntime."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import keras_preact
from keras_preact import pretrained
from keras_preact_training import export
from keras_preact_training.export import contract
from tests.conftest import KERAS_PREACT
from tests.test_export import BATCH_SIZES, CIFAR, CIFAR_CLASSES, calibrated, expected_outputs, normalize, random_pixels

onnxruntime = pytest.importorskip(
    "onnxruntime", reason='the onnx extra is not installed: pip install "keras-preact[onnx]"'
)
pytestmark = pytest.mark.tensorflow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def assert_onnx_matches(network, path, pixels):
    """Both ONNX models under onnxruntime equal the Keras model at each batch size."""
    metadata = contract.read_metadata(path)
    assert metadata["onnx"] == dict(
        files={"predict_pixels": "onnx/predict_pixels.onnx", "predict_normalized": "onnx/predict_normalized.onnx"},
        outputs=["logits", "probabilities", "class_ids"],
        sha256={
            signature: pretrained.sha256(os.path.join(path, file))
            for signature, file in metadata["onnx"]["files"].items()
        },
    )
    sessions = {
        signature: onnxruntime.InferenceSession(os.path.join(path, file), providers=["CPUExecutionProvider"])
        for signature, file in metadata["onnx"]["files"].items()
    }
    for signature, session in sessions.items():
        assert [(tensor.name, tensor.type) for tensor in session.get_inputs()] == [
            ("pixels", "tensor(uint8)") if signature == "predict_pixels" else ("normalized", "tensor(float)")
        ]
        assert [tensor.name for tensor in session.get_outputs()] == sorted(contract.ONNX_OUTPUTS)
    for batch_size in BATCH_SIZES:
        normalized = normalize(pixels[:batch_size], CIFAR)
        expected = expected_outputs(network, normalized, CIFAR_CLASSES, 5)
        for signature, inputs in [
            ("predict_pixels", {"pixels": pixels[:batch_size]}),
            ("predict_normalized", {"normalized": normalized}),
        ]:
            outputs = dict(zip(sorted(contract.ONNX_OUTPUTS), sessions[signature].run(None, inputs)))
            scale = np.abs(expected["logits"]).max()
            np.testing.assert_allclose(outputs["logits"], expected["logits"], atol=1e-5 * scale, rtol=1e-5)
            np.testing.assert_allclose(outputs["probabilities"], expected["probabilities"], atol=1e-5)
            np.testing.assert_array_equal(outputs["class_ids"], expected["class_ids"])


@pytest.mark.parametrize(
    "build",
    [
        *[
            lambda unit=unit: keras_preact.CifarResNet(20, unit=unit, input_shape=CIFAR.shape, classes=10)
            for unit in keras_preact.units.UNITS
        ],
        lambda: keras_preact.CifarResNet(29, "bottleneck", input_shape=CIFAR.shape, classes=10),
        lambda: keras_preact.CifarResNet(29, "bottleneck", input_shape=CIFAR.shape, classes=10, scan_units=True),
        lambda: keras_preact.get_model(
            "resnet20_original", input_shape=CIFAR.shape, classes=10, classifier_activation=None
        ),
    ],
    ids=[*keras_preact.units.UNITS, "bottleneck ResNet-29", "bottleneck ResNet-29 in loops", "original, logits"],
)
def test_onnx_models_equal_the_keras_model(tmp_path, build):
    pixels = random_pixels(8, CIFAR, seed=1)
    network = calibrated(build(), CIFAR, pixels)
    path = export.export_saved_model(
        network, str(tmp_path / "model"), CIFAR_CLASSES, CIFAR, formats=("onnx",), verbose=False
    )
    assert sorted(os.listdir(path)) == ["metadata.json", "onnx"]  # no SavedModel asked for
    assert contract.read_metadata(path)["formats"] == ["onnx"]
    assert_onnx_matches(network, path, pixels)


@pytest.mark.slow
def test_resnet1001_in_loops_exports_to_onnx(tmp_path):
    """ResNet-1001 with its units as loops, written as 333 separate units (about 5 min).
    An untrained ResNet-1001 turns float rounding of 1e-7 into 10 % of its logits
    (tests/test_export.py); its residual branches' last convolutions are scaled by 0.1
    here, so that the comparison measures the export rather than that amplification."""
    pixels = random_pixels(8, CIFAR, seed=2)
    network = keras_preact.ResNet1001(input_shape=CIFAR.shape, classes=10, scan_units=True)
    for weight in network.weights:
        if re.search(r"conv3[/_]kernel$", weight.path):
            weight.assign(weight * 0.1)
    network = calibrated(network, CIFAR, pixels)
    path = export.export_saved_model(
        network, str(tmp_path / "resnet1001"), CIFAR_CLASSES, CIFAR, formats=("onnx",), verbose=False
    )
    assert_onnx_matches(network, path, pixels)


def test_export_command_writes_every_format_of_the_shipped_weights(tmp_path):
    result = subprocess.run(
        [
            KERAS_PREACT,
            "export",
            "--model",
            "resnet20",
            "--weights",
            "cifar10",
            "--format",
            "all",
            "--output",
            str(tmp_path),
            "--images",
            "docs/cifar10/cat_0000.jpg",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    path = tmp_path / "cifar10_resnet20" / "1"
    # Folded: the stem's BatchNorm and the middle one of each of the 9 units.
    assert f"Exported resnet20 to {path} (a SavedModel, ONNX and LiteRT, 10 BatchNorms folded)" in result.stdout
    assert (
        f"ONNX models (checked with onnxruntime against the network): onnx/predict_pixels.onnx, "
        f"onnx/predict_normalized.onnx in {path}"
    ) in result.stdout
    assert (
        "LiteRT models (checked with LiteRT's interpreter against the network): "
        f"litert/predict_pixels.float32.tflite in {path}"
    ) in result.stdout
    assert "docs/cifar10/cat_0000.jpg  cat " in result.stdout  # the SavedModel's check, as before
    assert {"saved_model.pb", "onnx", "litert", "metadata.json"} <= set(os.listdir(path))
    metadata = contract.read_metadata(str(path))
    assert metadata["formats"] == ["saved_model", "onnx", "litert"] and metadata["folded_batch_norms"] == 10
    assert set(metadata["versions"]) == {"keras", "tensorflow", "onnx", "tf2onnx", "onnxruntime", "ai_edge_litert"}


def test_a_missing_extra_is_named(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tf2onnx", None)  # what `import tf2onnx` sees when it is not installed
    network = keras_preact.ResNet20(input_shape=CIFAR.shape, classes=10)
    with pytest.raises(
        ImportError,
        match=r"^ONNX export needs the onnx extra \(tf2onnx is not installed\): "
        r"pip install \"keras-preact\[onnx\]\"$",
    ):
        export.export_saved_model(
            network, str(tmp_path / "model"), CIFAR_CLASSES, CIFAR, formats=("onnx",), verbose=False
        )
    assert not os.path.exists(tmp_path / "model")  # refused before anything is written
    with pytest.raises(
        ValueError,
        match=r"formats must name some of \['saved_model', 'onnx', 'litert', 'kerashub'\]. Received: "
        r"formats=\('tflite',\)",
    ):
        export.export_saved_model(network, str(tmp_path / "model"), CIFAR_CLASSES, CIFAR, formats=("tflite",))
