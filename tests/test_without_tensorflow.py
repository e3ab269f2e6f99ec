"""Training and evaluation under JAX and PyTorch in a process where `import tensorflow` fails
(`tests/without_tensorflow/sitecustomize.py`): the NumPy input pipeline (`input_numpy`)
against tf.data's (`input_tensorflow`), checkpoints every backend resumes, kill and resume."""

import json
import os
import re
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

from keras_preact_training.data import datasets, input_numpy
from keras_preact_training.train import checkpoints, configs, named_configs
from tests.conftest import KERAS_PREACT, SHORT_DIGITS_RUN

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WITHOUT_TENSORFLOW = os.path.join(ROOT, "tests", "without_tensorflow")
DIGITS = named_configs.CONFIGS["digits_demo"]


def run(command, *arguments, backend, without_tensorflow=True, timeout=600):
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND=backend)
    if without_tensorflow:
        environment["PYTHONPATH"] = WITHOUT_TENSORFLOW
    return subprocess.run(
        [KERAS_PREACT, command, *arguments], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=timeout
    )


def summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.commands
def test_the_process_has_no_tensorflow():
    environment = dict(os.environ, PYTHONPATH=WITHOUT_TENSORFLOW)
    probe = (
        "import importlib.util, sys\n"
        "assert importlib.util.find_spec('tensorflow') is None\n"
        "try:\n    import tensorflow\nexcept ModuleNotFoundError:\n    sys.exit(0)\nsys.exit(1)\n"
    )
    assert (
        subprocess.run([os.path.join(os.path.dirname(KERAS_PREACT), "python"), "-c", probe], env=environment).returncode
        == 0
    )


# The order and the batches ----------------------------------------------------------------


def test_each_epoch_reads_a_permutation_of_its_own_seeded_by_the_run_and_the_epoch():
    """Every epoch its own permutation of the split (its first `used` places), the same for
    the same (seed, epoch) in any process, another for another epoch or seed; positions across
    epochs index it in turn."""
    first = datasets.epoch_order(1437, 1437, 0, 4)
    assert sorted(first) == list(range(1437)) and not np.array_equal(first, np.arange(1437))
    assert not np.array_equal(first, datasets.epoch_order(1437, 1437, 0, 5))
    assert not np.array_equal(first, datasets.epoch_order(1437, 1437, 1, 4))
    assert len(set(datasets.epoch_order(1437, 1400, 0, 4))) == 1400
    np.testing.assert_array_equal(first[:5], np.random.default_rng([0, 4]).permutation(1437)[:5])
    positions = np.arange(1400 * 3 + 10, 1400 * 4 + 20)  # the end of epoch 3 and the start of epoch 4
    np.testing.assert_array_equal(
        datasets.example_indices(positions, 1437, 1400, 0),
        np.concatenate([datasets.epoch_order(1437, 1400, 0, 3)[10:], datasets.epoch_order(1437, 1400, 0, 4)[:20]]),
    )


def first_batches(pipeline, split, config, first_step, total_steps):
    steps_per_epoch = configs.steps_per_epoch(split.size, config.batch_size)
    return list(pipeline.training_arrays(split, config, steps_per_epoch, first_step, total_steps))


def assert_same_batches(batches, expected):
    assert len(batches) == len(expected)
    for (images, labels), (expected_images, expected_labels) in zip(batches, expected):
        assert images.dtype == np.float32 and labels.dtype == np.int64
        np.testing.assert_array_equal(images, expected_images)
        np.testing.assert_array_equal(labels, expected_labels)


@pytest.mark.tensorflow
def test_both_pipelines_give_the_same_digits_batches():
    """Across an epoch's end (3 steps of 479 an epoch) and from a resumed step."""
    from keras_preact_training.data import input_tensorflow

    config = DIGITS.override("batch_size=479")
    split = datasets.load(config).train
    assert_same_batches(
        first_batches(input_numpy, split, config, 0, 7), first_batches(input_tensorflow, split, config, 0, 7)
    )
    assert_same_batches(
        first_batches(input_numpy, split, config, 5, 7), first_batches(input_tensorflow, split, config, 0, 7)[5:]
    )


def folder_with_other_sizes(source, root):
    """A folder of 12 CIFAR-10 images a class from `source` (PNG files), two of each class's
    training images re-encoded as JPEGs at other sizes (48 x 40, 20 x 24) and one as a JPEG of
    its own size: what the pipelines decode and resize."""
    from PIL import Image

    for split, count in (("train", 12), ("test", 4)):
        for name in sorted(os.listdir(os.path.join(source, split)))[:3]:
            os.makedirs(root / split / name)
            files = sorted(os.listdir(os.path.join(source, split, name)))[:count]
            for index, file in enumerate(files):
                target = root / split / name / file
                shutil.copy(os.path.join(source, split, name, file), target)
                if split == "train" and index < 3:
                    with Image.open(target) as image:
                        resized = image.resize(((48, 40), (20, 24), image.size)[index])
                    resized.save(target.with_suffix(".jpg"), quality=(90, 90, 75)[index])
                    target.unlink()
    return root


@pytest.mark.tensorflow
def test_both_pipelines_decode_and_resize_image_folders_alike(cifar_folder, tmp_path):
    """The same batches of JPEGs (Pillow's and TensorFlow's accurate DCT), PNGs and resized
    images, in memory (`input_numpy.prepare`) and decoded batch by batch (a folder too large
    for memory); evaluation batches too."""
    from keras_preact_training.data import input_tensorflow

    root = folder_with_other_sizes(cifar_folder, tmp_path / "folder")
    config = named_configs.CONFIGS["cifar10_zoo"].override(f"data_dir={root}", "batch_size=8")
    numpy_set = datasets.load(config.override("input_pipeline=numpy"))
    tensorflow_set = datasets.load(config.override("input_pipeline=tensorflow"))
    assert numpy_set.train.items.dtype == np.float32 and numpy_set.train.items.shape == (36, 32, 32, 3)
    assert datasets.holds_files(tensorflow_set.train)
    expected = first_batches(input_tensorflow, tensorflow_set.train, config, 0, 10)
    assert_same_batches(first_batches(input_numpy, numpy_set.train, config, 0, 10), expected)
    assert_same_batches(first_batches(input_numpy, tensorflow_set.train, config, 0, 10), expected)  # from files
    assert_same_batches(
        list(input_numpy.evaluation_arrays(numpy_set.test, 5)),
        list(input_tensorflow.evaluation_arrays(tensorflow_set.test, 5)),
    )


def test_a_folder_larger_than_memory_stays_files(cifar_folder, tmp_path, monkeypatch):
    root = folder_with_other_sizes(cifar_folder, tmp_path / "folder")
    config = named_configs.CONFIGS["cifar10_zoo"].override(f"data_dir={root}", "input_pipeline=numpy")
    in_memory = datasets.load(config)
    monkeypatch.setattr(input_numpy, "MEMORY_LIMIT_BYTES", 1000)
    from_files = datasets.load(config)
    assert datasets.holds_files(from_files.train) and not datasets.holds_files(in_memory.train)
    steps = configs.steps_per_epoch(36, 8)
    assert_same_batches(
        list(input_numpy.training_arrays(from_files.train, config.override("batch_size=8"), steps, 0, 6)),
        list(input_numpy.training_arrays(in_memory.train, config.override("batch_size=8"), steps, 0, 6)),
    )


def test_unreadable_images_are_named(tmp_path):
    root = tmp_path / "folder"
    for split in ("train", "test"):
        (root / split / "cat").mkdir(parents=True)
        (root / split / "cat" / "0.png").write_bytes(b"not an image")
    config = named_configs.CONFIGS["cifar10_zoo"].override(f"data_dir={root}", "input_pipeline=numpy")
    with pytest.raises(ValueError, match=r"The train split holds files that do not decode as images .*0\.png"):
        datasets.load(config)


def test_tensorflow_datasets_need_tensorflow():
    with pytest.raises(
        ValueError,
        match="dataset=cifar10 is read through tensorflow-datasets, which needs "
        "TensorFlow. Received: input_pipeline=numpy",
    ):
        datasets.load(named_configs.CONFIGS["cifar10_paper"].override("input_pipeline=numpy"))


# Checkpoints ------------------------------------------------------------------------------


def test_checkpoints_are_written_whole_and_the_newest_three_kept(tmp_path):
    values = {"model/0:dense.kernel": np.ones((2, 3), np.float32), "optimizer/0:iteration": np.array(7, np.int64)}
    for step in (5, 10, 15, 20):
        checkpoints.save(str(tmp_path), step, values)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-10.npz", "ckpt-15.npz", "ckpt-20.npz"]
    with np.load(tmp_path / "ckpt-20.npz") as archive:
        assert sorted(archive.files) == sorted(values)
        np.testing.assert_array_equal(archive["model/0:dense.kernel"], values["model/0:dense.kernel"])


# The command, without TensorFlow --------------------------------------------------------


@pytest.mark.commands
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_killed_run_without_tensorflow_resumes_to_the_same_weights(tmp_path, backend):
    """`keras-preact train` under JAX and PyTorch with no TensorFlow: killed after a checkpoint,
    its newest checkpoint truncated, the run resumes from the one before and ends with the
    weights of the uninterrupted run."""
    whole = run("train", "--run-dir", str(tmp_path / "whole"), *SHORT_DIGITS_RUN, backend=backend)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert not (tmp_path / "whole" / "tensorboard").exists()
    assert (tmp_path / "whole" / "curves.png").exists() and (tmp_path / "whole" / "model.keras").exists()
    assert json.loads((tmp_path / "whole" / "config.json").read_text())["input_pipeline"] is None

    killed = tmp_path / "killed"
    environment = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=WITHOUT_TENSORFLOW)
    process = subprocess.Popen(
        [KERAS_PREACT, "train", "--run-dir", str(killed), *SHORT_DIGITS_RUN],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 300
    while time.time() < deadline and not (killed / "checkpoints" / "ckpt-15.npz").exists():
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (killed / "summary.json").exists(), "the run finished before it was killed"
    steps = sorted(checkpoints.steps(str(killed / "checkpoints")))
    newest = killed / "checkpoints" / f"ckpt-{steps[-1]}.npz"
    newest.write_bytes(newest.read_bytes()[:1000])

    resumed = run("train", "--run-dir", str(killed), *SHORT_DIGITS_RUN, backend=backend)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Checkpoint {newest} cannot be restored" in resumed.stdout
    before = killed / "checkpoints" / f"ckpt-{steps[-2]}.npz"
    assert f"Resuming from {before} at step {steps[-2]} of 44." in resumed.stdout
    assert summary(killed)["weights_sha256"] == summary(tmp_path / "whole")["weights_sha256"]


@pytest.mark.commands
def test_keras_on_tensorflow_without_tensorflow_is_one_line_that_says_what_to_do(tmp_path):
    result = run("train", "--run-dir", str(tmp_path / "run"), *SHORT_DIGITS_RUN, backend="tensorflow")
    assert result.returncode == 2
    assert result.stderr == (
        "error: TensorFlow, Keras' backend here (KERAS_BACKEND=tensorflow), is not installed. "
        "Install it (pip install 'keras-preact[tensorflow]'), or set KERAS_BACKEND=jax or torch: "
        "train and evaluate run there without it.\n"
    )


@pytest.mark.tensorflow
def test_a_tensorflow_run_resumes_under_torch_without_tensorflow_and_back(tmp_path):
    """One checkpoint format for every backend and input pipeline: a run begun under TensorFlow
    (tf.data) goes on under PyTorch with NumPy's pipeline and no TensorFlow, and then under
    TensorFlow again; each resumes at the step the other stopped at."""
    run_dir = str(tmp_path / "run")
    first = run(
        "train",
        "--run-dir",
        run_dir,
        *SHORT_DIGITS_RUN,
        "--set",
        "duration=1",
        backend="tensorflow",
        without_tensorflow=False,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    second = run(
        "train",
        "--run-dir",
        run_dir,
        *SHORT_DIGITS_RUN,
        "--set",
        "duration=1.5",
        "--allow-config-changes",
        backend="torch",
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"Resuming from {os.path.join(run_dir, 'checkpoints', 'ckpt-22.npz')} at step 22 of 33." in second.stdout
    third = run(
        "train",
        "--run-dir",
        run_dir,
        *SHORT_DIGITS_RUN,
        "--allow-config-changes",
        backend="tensorflow",
        without_tensorflow=False,
    )
    assert third.returncode == 0, third.stderr[-3000:]
    assert f"Resuming from {os.path.join(run_dir, 'checkpoints', 'ckpt-33.npz')} at step 33 of 44." in third.stdout


@pytest.mark.tensorflow
def test_a_run_checkpointed_in_tensorflows_format_resumes(tmp_path):
    """Runs checkpointed before the .npz format (a `tf.train.Checkpoint` of the variables by
    key) resume from it where TensorFlow is installed, to the uninterrupted run's weights."""
    import tensorflow as tf

    deterministic = [*SHORT_DIGITS_RUN, "--set", "deterministic=true"]
    whole = run(
        "train", "--run-dir", str(tmp_path / "whole"), *deterministic, backend="tensorflow", without_tensorflow=False
    )
    assert whole.returncode == 0, whole.stderr[-3000:]
    shutil.copytree(tmp_path / "whole", tmp_path / "legacy")
    folder = tmp_path / "legacy" / "checkpoints"
    with np.load(folder / "ckpt-35.npz") as values:
        parts = {
            part: {
                key.partition("/")[2]: tf.Variable(values[key]) for key in values.files if key.startswith(part + "/")
            }
            for part in ("model", "optimizer")
        }
    for name in os.listdir(folder):
        os.remove(folder / name)
    (tmp_path / "legacy" / "summary.json").unlink()
    tf.train.Checkpoint(**parts).write(str(folder / "ckpt-35"))
    resumed = run(
        "train", "--run-dir", str(tmp_path / "legacy"), *deterministic, backend="tensorflow", without_tensorflow=False
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Resuming from {folder / 'ckpt-35'} at step 35 of 44." in resumed.stdout
    assert sorted(os.listdir(folder))[-1] == "ckpt-44.npz"
    assert summary(tmp_path / "legacy")["weights_sha256"] == summary(tmp_path / "whole")["weights_sha256"]
    without = run(
        "train",
        "--run-dir",
        str(tmp_path / "legacy"),
        *SHORT_DIGITS_RUN,
        "--set",
        "duration=3",
        "--allow-config-changes",
        backend="torch",
    )
    assert without.returncode == 0 and "Resuming from" in without.stdout, without.stderr[-3000:]


def small_cifar_folder(source, root, per_class):
    for split in ("train", "test"):
        for name in sorted(os.listdir(os.path.join(source, split))):
            os.makedirs(root / split / name)
            for file in sorted(os.listdir(os.path.join(source, split, name)))[:per_class]:
                shutil.copy(os.path.join(source, split, name, file), root / split / name / file)
    return root


@pytest.mark.commands
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_evaluate_without_tensorflow_gives_tensorflows_answer(cifar_folder, tmp_path, backend):
    """`keras-preact evaluate` of the zoo's ResNet-20 on 100 test images: the same errors and
    per-class accuracies as under TensorFlow, which decodes them with tf.data."""
    root = str(small_cifar_folder(cifar_folder, tmp_path / "cifar", 10))
    arguments = ["--model", "resnet20", "--weights", "cifar10", "--data-dir", root, "--flip"]
    without = run("evaluate", *arguments, backend=backend)
    assert without.returncode == 0, without.stderr[-3000:]
    with_tensorflow = run("evaluate", *arguments, backend="tensorflow", without_tensorflow=False)
    assert with_tensorflow.returncode == 0, with_tensorflow.stderr[-3000:]

    def lines(result):
        timing = r" \(data and network loaded in [\d.]+ s, then [\d.]+ s: \d+ images/s\)"
        return re.sub(timing, "", result.stdout).splitlines()

    assert lines(without) == lines(with_tensorflow)
    assert "resnet20 (cifar10): test error" in without.stdout
