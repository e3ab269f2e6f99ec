"""KerasHub presets of keras-preact networks (`keras_preact.hub`, `export --format kerashub`):
written from the zoo's weights, loaded by KerasHub's own `from_preset` after `import
keras_preact` in a process that cannot reach any network, on whichever backend runs the
tests, with the network's probabilities; fine-tuned with `fit`; the errors of a missing
KerasHub and of a directory that is not a preset of ours."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_preact
from keras_preact import defaults
from tests.conftest import KERAS_PREACT, ROOT

keras_hub = pytest.importorskip("keras_hub", reason='KerasHub is not installed: pip install "keras-preact[hub]"')
# The largest difference of probabilities between a loaded preset and the network: float32 rounding.
PROBABILITY_TOLERANCE = 1e-5
# Run before the test's code in a process of its own: every connection refused, as offline.
OFFLINE = (
    "import socket\n"
    "def refuse(*arguments, **keywords):\n"
    "    raise OSError('this process reaches no network')\n"
    "socket.socket.connect = refuse\n"
    "socket.create_connection = refuse\n"
)
LOAD = (
    OFFLINE + "import sys, json, numpy as np\n"
    "import keras_preact, keras_hub\n"
    "pixels = np.load(sys.argv[2])\n"
    "classifier = keras_hub.models.ImageClassifier.from_preset(sys.argv[1])\n"
    "backbone = keras_hub.models.Backbone.from_preset(sys.argv[1])\n"
    "np.save(sys.argv[3], classifier.predict(pixels, verbose=0))\n"
    "print(json.dumps([type(classifier).__name__, type(backbone).__name__, list(backbone.output_shape)]))\n"
)


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    """The zoo's ResNet-20 as a KerasHub preset, written on the backend that runs the tests."""
    from keras_preact import hub

    folder = tmp_path_factory.mktemp("hub") / "resnet20"
    network = keras_preact.ResNet20(weights="cifar10")
    hub.image_classifier(network, defaults.CIFAR10_MEAN, defaults.CIFAR10_STD).save_to_preset(str(folder))
    return folder


def pixels(count=8):
    return np.random.default_rng(0).integers(0, 256, (count, 32, 32, 3)).astype("float32")


def test_a_preset_loads_offline_with_kerashubs_own_from_preset_and_answers_as_the_network(preset, tmp_path):
    from keras_preact import hub

    assert sorted(os.listdir(preset)) == sorted(hub.PRESET_FILES)
    np.save(tmp_path / "pixels.npy", pixels())
    result = subprocess.run(
        [sys.executable, "-c", LOAD, str(preset), str(tmp_path / "pixels.npy"), str(tmp_path / "out.npy")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == [
        "PreActResNetImageClassifier",
        "PreActResNetBackbone",
        [None, 8, 8, 64],
    ]
    expected = keras_preact.ResNet20(weights="cifar10", include_preprocessing=True).predict(pixels(), verbose=0)
    difference = np.abs(np.load(tmp_path / "out.npy") - expected).max()
    print(f"{keras.backend.backend()}: largest probability difference {difference:.2e}")
    assert difference <= PROBABILITY_TOLERANCE


def test_a_loaded_preset_fine_tunes_with_fit(preset):
    from keras_preact import hub

    classifier = hub.from_preset(str(preset))
    classifier.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
    images, labels = pixels(16), np.arange(16) % 10
    before = [np.array(weight) for weight in classifier.backbone.weights]
    history = classifier.fit(images, labels, batch_size=8, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2 and all(np.isfinite(history.history["loss"]))
    assert any(not np.array_equal(old, np.array(new)) for old, new in zip(before, classifier.backbone.weights))


def test_a_directory_that_is_not_a_preset_of_ours_is_one_line(tmp_path):
    from keras_preact import hub

    (tmp_path / "task.json").write_text(json.dumps({"registered_name": "keras_hub>ResNetImageClassifier"}))
    with pytest.raises(ValueError) as error:
        hub.from_preset(str(tmp_path))
    assert str(error.value) == (
        f"{tmp_path} is not a KerasHub preset of a keras-preact classifier (its task.json names "
        "'keras_hub>ResNetImageClassifier'; `keras-preact export --format kerashub` writes one). "
        f"Received: directory={str(tmp_path)!r}"
    )
    with pytest.raises(ValueError, match="its task.json names None"):
        hub.from_preset(str(tmp_path / "nowhere"))


def test_without_kerashub_the_module_and_the_format_say_what_to_install(tmp_path):
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "keras_hub.py").write_text("raise ImportError('no keras_hub here')\n")
    environment = dict(os.environ, PYTHONPATH=str(blocked), TF_CPP_MIN_LOG_LEVEL="3")
    imported = subprocess.run(
        [sys.executable, "-c", "import keras_preact.hub"], cwd=ROOT, capture_output=True, text=True, env=environment
    )
    assert imported.returncode == 1
    assert imported.stderr.strip().splitlines()[-1] == (
        'ImportError: keras_preact.hub needs KerasHub, which is not installed: pip install "keras-preact[hub]"'
    )


@pytest.mark.commands
def test_export_writes_a_preset_that_loads_back(tmp_path):
    result = subprocess.run(
        [KERAS_PREACT, "export", "--model", "resnet20", "--weights", "cifar10", "--format", "kerashub"]
        + ["--output", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    version = tmp_path / "cifar10_resnet20" / "1"
    assert f"Exported resnet20 to {version} (a KerasHub preset) in " in result.stdout
    metadata = json.loads((version / "metadata.json").read_text())
    assert metadata["formats"] == ["kerashub"] and sorted(os.listdir(version)) == ["kerashub", "metadata.json"]
    assert metadata["kerashub"]["files"]["task.json"] == os.path.join("kerashub", "task.json")
    from keras_preact_training.export import contract

    assert metadata["kerashub"]["sha256"] == contract.digests(str(version), metadata["kerashub"]["files"])
