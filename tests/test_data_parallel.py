"""`--strategy data_parallel` under JAX (Keras' `keras.distribution`), on this CPU's host
devices (`XLA_FLAGS=--xla_force_host_platform_device_count=2`) and in two processes on
127.0.0.1: the weights of one device training the same global batches, to float32 rounding;
checkpoints that resume on another device count; a process that ends ends the other in one
line, and the run resumes."""

import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import KERAS_PREACT, ROOT

pytestmark = pytest.mark.commands
# The digits, 6 steps at batch 64 (0.27 of an epoch), logged each step; a checkpoint every 3.
DIGITS = [
    "--config",
    "digits_demo",
    "--set",
    "duration=0.27",
    "--set",
    "checkpoint_every=3",
    "--set",
    "evaluate_every=6",
    "--set",
    "log_every=1",
]
# How far one step on two devices may land from the same step on one, and two short runs
# apart: the global batch's sums (BatchNorm's statistics, the gradients) are added in
# another order by the devices' all-reduce, float32 rounding apart each step (1e-7 to 3e-5 of
# weights and moving statistics up to 4, 2026-11-27). Training amplifies such differences
# step by step, as any change of rounding would (ResNet-20 on 640 CIFAR-10 images: 5e-5 in
# the loss after 4 steps, 1.4 in a moving variance after 20), so the runs compared are short:
# after the 6 steps of DIGITS the stem's kernel lands 3.5e-4 apart, where a step more or less
# moves some weight by 0.1 to 0.5.
STEP_TOLERANCE = 1e-4
WEIGHTS_TOLERANCE = 1e-3
# One step from the same state compared in float64, where the all-reduce's other order of
# addition is float64 rounding apart: at most 5.0e-16 over the whole state in the test's 15
# steps (ResNet-20, batch 32; 4.4e-16 in 20 steps at batch 64, a moving variance near 3 two
# units in the last place apart; 2026-12-04). In float32 the 20 steps landed up to 1.1e-5 apart
# on an AVX-512 processor and 1.6e-4 on an AVX2 one: the backward pass amplifies the kernels'
# rounding by how ill-conditioned a step's gradients are, which no tolerance fixed in advance
# bounds. A step moves the stem's kernel by up to 2.5e-3 (its first velocity), so arithmetic
# wrong by a thousandth of a step (another batch's BatchNorm statistics, gradients summed and
# not averaged) is a million times the tolerance.
FLOAT64_STEP_TOLERANCE = 1e-12
# One step from the same state on one device and on every device (data_parallel), for each
# of the first steps of a config, in float64 (Keras' floatx; the script sets no dtype policy of
# the config's): prints the largest difference of the states after it.
STEP_BY_STEP = """
import sys
import jax, keras, numpy as np
jax.config.update("jax_enable_x64", True)
keras.config.set_floatx("float64")
from keras_preact_training.train import configs, named_configs, engines
from keras_preact_training.data import datasets
config = named_configs.get_config(sys.argv[1], sys.argv[2:])
dataset = datasets.load(config)
steps_per_epoch = configs.steps_per_epoch(dataset.train.size, config.batch_size)
total = config.total_steps(steps_per_epoch)
engines_by_strategy = {}
for strategy in ("default", "data_parallel"):
    engine = engines.JaxSteps(config.override(f"strategy={strategy}"))
    engine.build(dataset, steps_per_epoch)
    engine.loaded()
    engine.start(dataset.train, steps_per_epoch, 0, total)
    engines_by_strategy[strategy] = engine
one, every = engines_by_strategy["default"], engines_by_strategy["data_parallel"]
largest = 0.0
for step in range(total):
    state = jax.tree_util.tree_map(np.asarray, one.state)
    images, labels = next(one.batches)
    _, _, on_one = one.train_step(one.state, images, labels)
    _, _, on_every = every.train_step(
        jax.tree_util.tree_map(every.parallel.replicated, state), *every.parallel.global_batch(images, labels)
    )
    largest = max([largest] + [
        float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
        for a, b in zip(jax.tree_util.tree_leaves(on_one), jax.tree_util.tree_leaves(on_every))
    ])
    one.state = on_one
print(len(jax.devices()), "devices", total, "steps", largest)
"""


def run(run_dir, *arguments, devices=1, wait=True, extra_environment=None):
    environment = dict(
        os.environ,
        KERAS_BACKEND="jax",
        TF_CPP_MIN_LOG_LEVEL="3",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        **(extra_environment or {}),
    )
    command = [KERAS_PREACT, "train", *arguments, "--run-dir", str(run_dir)]
    if not wait:
        return subprocess.Popen(
            command, cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    result = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def final_weights(run_dir):
    """The network's weights in the run's last checkpoint, by name."""
    checkpoints = sorted((run_dir / "checkpoints").glob("ckpt-*.npz"), key=lambda path: int(path.stem.split("-")[1]))
    with np.load(checkpoints[-1]) as values:
        return {name: values[name] for name in values.files if name.startswith("model/")}


def assert_close(first, second):
    first, second = final_weights(first), final_weights(second)
    assert sorted(first) == sorted(second)
    largest = max(float(np.max(np.abs(first[name] - second[name]))) for name in first)
    print(f"largest weight difference: {largest:.2e}")
    assert largest < WEIGHTS_TOLERANCE


@pytest.mark.parametrize("subset", ["digits", "cifar10"])
def test_a_step_on_two_devices_is_the_step_on_one(request, subset):
    """Each of a run's first steps, from the same state: on two devices, the state one device
    computes, to float64 rounding (the whole state: weights, BatchNorm's statistics, the
    optimizer's momenta, the augmentation's random state)."""
    if subset == "digits":
        settings = ["digits_demo", "duration=0.5"]
    else:
        folder = request.getfixturevalue("cifar_folder")
        settings = ["cifar10_zoo", "model=resnet20", f"data_dir={folder}", "train_examples=320", "batch_size=32"]
        settings += ["duration=1.5", "precision=float32"]
    result = subprocess.run(
        [sys.executable, "-c", STEP_BY_STEP, *settings],
        cwd=ROOT,
        env=dict(os.environ, KERAS_BACKEND="jax", XLA_FLAGS="--xla_force_host_platform_device_count=2"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    devices, _, steps, _, largest = result.stdout.split()[-5:]
    print(f"{subset}: {steps} steps, largest difference {float(largest):.2e}")
    assert devices == "2" and int(steps) >= 10 and float(largest) < FLOAT64_STEP_TOLERANCE


def test_two_devices_train_the_weights_of_one_and_resume_from_each_other(tmp_path):
    run(tmp_path / "one", *DIGITS)
    two = run(tmp_path / "two", *DIGITS, "--strategy", "data_parallel", devices=2)
    assert "Final test error" in two.stdout
    assert_close(tmp_path / "one", tmp_path / "two")
    # Begun on two devices, stopped after a checkpoint, finished on one; and the other way.
    for first, then, name in ((2, 1, "two-then-one"), (1, 2, "one-then-two")):
        strategy = ["--strategy", "data_parallel"]
        begun = run(tmp_path / name, *DIGITS, *(strategy if first == 2 else []), devices=first, wait=False)
        deadline = time.time() + 300
        while not (tmp_path / name / "checkpoints" / "ckpt-3.npz").exists() and time.time() < deadline:
            time.sleep(0.05)
        begun.kill()
        begun.communicate()
        resumed = run(
            tmp_path / name,
            *DIGITS,
            "--allow-config-changes",
            *(strategy if then == 2 else []),
            devices=then,
        )
        assert "Resuming from" in resumed.stdout
        assert_close(tmp_path / "one", tmp_path / name)


def test_the_command_trains_a_cifar10_subset_on_two_devices(cifar_folder, tmp_path):
    """`keras-preact train --strategy data_parallel` on 640 CIFAR-10 images, 4 steps at the
    full rate: the run's files as one device's, its first step's loss one device's to float32
    rounding and its second's to one step's rounding apart (STEP_TOLERANCE: 1e-5 of the loss
    on an AVX2-only processor, where AVX-512's kernels rounded closer; the steps after drift
    apart as training amplifies rounding: `test_a_step_on_two_devices_is_the_step_on_one`
    compares them step by step)."""
    subset = [
        "--config",
        "cifar10_zoo",
        "--model",
        "resnet20",
        "--data-dir",
        cifar_folder,
        "--set",
        "train_examples=640",
        "--set",
        "test_examples=100",
        "--set",
        "batch_size=64",
        "--set",
        "duration=0.4",
        "--set",
        "warmup=0",
        "--set",
        "precision=float32",
        "--set",
        "log_every=1",
    ]
    run(tmp_path / "one", *subset)
    run(tmp_path / "two", *subset, "--strategy", "data_parallel", devices=2)
    for name in ("summary.json", "model.keras", "curves.png", "log.csv", "checkpoints/ckpt-4.npz"):
        assert (tmp_path / "two" / name).exists(), name
    losses = [np.genfromtxt(tmp_path / name / "log.csv", delimiter=",", names=True)["loss"] for name in ("one", "two")]
    assert len(losses[1]) == 4
    np.testing.assert_allclose(losses[1][0], losses[0][0], rtol=1e-6)
    np.testing.assert_allclose(losses[1][1], losses[0][1], rtol=STEP_TOLERANCE)


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def processes(run_dir, count=2, arguments=DIGITS):
    coordinator = f"127.0.0.1:{free_port()}"
    return [
        run(
            run_dir,
            *arguments,
            "--strategy",
            "data_parallel",
            "--coordinator",
            coordinator,
            "--processes",
            str(count),
            "--process-id",
            str(index),
            wait=False,
        )
        for index in range(count)
    ]


def test_two_processes_train_the_weights_of_one(tmp_path):
    """Two processes of one host device each, joined through JAX's distributed runtime on
    127.0.0.1, each reading its half of every batch: process 0 writes the run's files."""
    run(tmp_path / "one", *DIGITS)
    started = time.perf_counter()
    outputs = [process.communicate(timeout=600) for process in processes(tmp_path / "two")]
    print(f"two processes: {time.perf_counter() - started:.1f} s")
    assert all("error" not in error for _, error in outputs), [error[-2000:] for _, error in outputs]
    assert "Final test error" in outputs[0][0] and "Final test error" not in outputs[1][0]
    assert_close(tmp_path / "one", tmp_path / "two")


def test_a_process_that_ends_ends_the_other_in_one_line_and_the_run_resumes(tmp_path):
    run(tmp_path / "one", *DIGITS)
    first, second = processes(tmp_path / "two")
    deadline = time.time() + 300
    while not (tmp_path / "two" / "checkpoints" / "ckpt-3.npz").exists() and time.time() < deadline:
        time.sleep(0.05)
    second.kill()
    second.communicate()
    ended = time.perf_counter()
    _, error = first.communicate(timeout=120)
    print(f"the other process ended {time.perf_counter() - ended:.1f} s later")
    assert first.returncode == 5, error[-3000:]
    lines = [line for line in error.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith("error: process 0 of 2 lost another process of the run ("), error
    assert lines[0].endswith("start every process again to resume from the last checkpoint")
    outputs = [process.communicate(timeout=600) for process in processes(tmp_path / "two")]
    assert "Resuming from" in outputs[0][0], outputs[0][1][-2000:]
    assert_close(tmp_path / "one", tmp_path / "two")


@pytest.mark.parametrize(
    "arguments, backend, message",
    [
        (["--strategy", "data_parallel"], "torch", "Under KERAS_BACKEND=torch, keras-preact train runs with strategy"),
        (
            ["--strategy", "data_parallel"],
            "tensorflow",
            "--strategy data_parallel is Keras' data parallelism under KERAS_BACKEND=jax.",
        ),
        (
            ["--coordinator", "127.0.0.1:1234", "--processes", "2", "--process-id", "0"],
            "jax",
            "--coordinator, --processes and --process-id are --strategy data_parallel's",
        ),
        (
            ["--strategy", "data_parallel", "--coordinator", "127.0.0.1:1234"],
            "jax",
            "Several processes need --coordinator HOST:PORT, --processes N and --process-id I together. "
            "Received: --coordinator='127.0.0.1:1234', --processes=None, --process-id=None",
        ),
        (
            ["--strategy", "data_parallel", "--coordinator", "localhost", "--processes", "2", "--process-id", "0"],
            "jax",
            "--coordinator must be HOST:PORT (process 0's). Received: --coordinator='localhost'",
        ),
        (
            ["--strategy", "data_parallel", "--coordinator", "127.0.0.1:1", "--processes", "2", "--process-id", "2"],
            "jax",
            "--processes must be at least 1 and --process-id from 0 to --processes - 1. "
            "Received: --processes=2, --process-id=2",
        ),
        (
            ["--strategy", "data_parallel", "--set", "batch_size=63"],
            "jax",
            "batch_size must be divisible by the number of devices (2: cpu:0, cpu:1). Received: batch_size=63",
        ),
    ],
    ids=["torch", "tensorflow", "flags without data_parallel", "flags missing", "address", "id", "batch"],
)
def test_what_data_parallel_cannot_run_is_refused_in_one_line(tmp_path, arguments, backend, message):
    environment = dict(
        os.environ,
        KERAS_BACKEND=backend,
        TF_CPP_MIN_LOG_LEVEL="3",
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
    )
    result = subprocess.run(
        [KERAS_PREACT, "train", *DIGITS, *arguments, "--run-dir", str(tmp_path / "run")],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith(f"error: {message}"), result.stderr[-2000:]
    assert result.stderr.count("\n") == 1


def test_the_module_names_keras_environment_variables():
    """The environment variables train reads are Keras' own (keras.distribution.initialize's)."""
    import inspect

    import keras

    from keras_preact_training.train import data_parallel

    source = inspect.getsource(sys.modules[keras.distribution.initialize.__module__])
    for name in data_parallel.ENVIRONMENT.values():
        assert name in source, name
