"""A new user's first steps print nothing: importing keras_preact, then building, loading
and predicting with a network, as the README's quick start 2 does, writes nothing to
standard error on any backend, and under JAX and PyTorch never loads TensorFlow; training
as quick start 1 does prints only its progress bar.

Each runs in a fresh process, as a user's script would, without the tests'
`TF_CPP_MIN_LOG_LEVEL` (TensorFlow's start-up lines are what keras_preact holds back).
"""

import os
import subprocess
import sys

import pytest

from keras_preact import pretrained
from tests.conftest import ROOT
from tests.test_docs import BLOCK, README, read, substituted, substitutions

# Each backend is a fresh process of its own; they run once, in the TensorFlow run.
pytestmark = pytest.mark.tensorflow

FIRST_STEPS = """
import sys
import numpy as np
for network in (keras_preact.ResNet164(), keras_preact.ResNet110(merge=keras_preact.ExclusiveGating(-6)),
                keras_preact.ResNet50(weights=None, classes=10)):
    network.predict(np.zeros((1,) + network.input_shape[1:], "float32"), verbose=0)
print("tensorflow loaded:", "tensorflow" in sys.modules)
"""


def run_quietly(code, backend, cwd=ROOT):
    environment = {name: value for name, value in os.environ.items() if name != "TF_CPP_MIN_LOG_LEVEL"}
    environment["KERAS_BACKEND"] = backend
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=environment, capture_output=True, text=True, timeout=600
    )


def readme_quick_start(number):
    return BLOCK.findall(read(README))[number - 1]


@pytest.mark.skipif(
    "resnet20" not in pretrained.shipped_networks("cifar10"),
    reason="the zoo ships no CIFAR-10 ResNet-20 (keras_preact/weights/registry.json)",
)
@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_the_quick_start_prints_nothing_and_loads_tensorflow_only_on_its_backend(backend):
    result = run_quietly(readme_quick_start(2) + FIRST_STEPS, backend)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "[[(3, 'cat'," in result.stdout
    assert f"tensorflow loaded: {backend == 'tensorflow'}" in result.stdout


def test_the_training_quick_start_prints_nothing_on_standard_error(tmp_path):
    """Quick start 1 (ResNet-1001, one epoch on ten images): no start-up lines, no XLA notices,
    no Keras warning; its progress bar is on standard output."""
    result = run_quietly(substituted(readme_quick_start(1), substitutions(tmp_path)), "tensorflow")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert "loss:" in result.stdout


def test_tensorflow_loaded_before_keras_preact_finds_its_devices_quietly():
    """Keras imported first prints TensorFlow's start-up lines (Keras' own import); the first
    device query, which prints the CUDA probe's error line, is then keras_preact's, held."""
    code = (
        "import sys, keras\nprint('--- keras_preact', file=sys.stderr)\nimport keras_preact\n"
        "keras_preact.ResNet20().predict(__import__('numpy').zeros((1, 32, 32, 3)), verbose=0)\n"
    )
    result = run_quietly(code, "tensorflow")
    assert result.returncode == 0, result.stderr
    assert result.stderr.split("--- keras_preact\n")[1] == ""


def test_a_failed_tensorflow_load_shows_what_it_printed(tmp_path):
    """The lines held while TensorFlow loads are shown when the load fails."""
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(
        "import os\nos.write(2, b'a line of the failed load\\n')\nraise ImportError('broken TensorFlow')\n"
    )
    code = (
        f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nimport keras_preact\n"
        "try:\n    import tensorflow\nexcept ImportError as error:\n    print(error)\n"
    )
    result = run_quietly(code, "jax")
    assert result.stdout == "broken TensorFlow\n"
    assert result.stderr == "a line of the failed load\n"


@pytest.mark.parametrize("setting, kernels_on", [(None, True), ("0", False)])
def test_commands_load_tensorflow_with_its_onednn_kernels_unless_told_not_to(setting, kernels_on):
    """TensorFlow says as it loads (its informational lines, shown with `--verbose`) whether its
    oneDNN kernels are on: a command turns them on, also where TensorFlow's own default leaves
    them off (a processor with AVX2 alone), and `TF_ENABLE_ONEDNN_OPTS=0` keeps them off."""
    environment = {name: value for name, value in os.environ.items() if name != "TF_ENABLE_ONEDNN_OPTS"}
    environment.update(TF_CPP_MIN_LOG_LEVEL="0", KERAS_BACKEND="tensorflow")
    if setting is not None:
        environment["TF_ENABLE_ONEDNN_OPTS"] = setting
    code = "from keras_preact_training import tensorflow_import\ntensorflow_import.import_tensorflow(verbose=True)\n"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr
    assert ("oneDNN custom operations are on" in result.stderr) == kernels_on
