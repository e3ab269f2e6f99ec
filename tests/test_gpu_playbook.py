"""scripts/gpu_playbook.py and scripts/zoo_queue.sh, on this machine's CPU: the queue file both
read, and a run the playbook packs, starts, stops, bundles and lands, then resumed by
`keras-preact train` from the landed checkpoint to the weights of an uninterrupted run."""

import json
import os
import shutil
import subprocess
import tarfile
import time

import numpy as np
import pytest

from scripts import gpu_playbook as playbook
from tests.conftest import KERAS_PREACT, SHORT_DIGITS_RUN

pytestmark = pytest.mark.commands
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_queue_is_read_in_order():
    """Each runner's runs in the order of scripts/queue.txt's lines (the runs landed leave it)."""
    with open(os.path.join(ROOT, "scripts", "queue.txt")) as queue:
        lines = [line.split("|") for line in queue if line.strip() and not line.startswith("#")]
    gpu = [name for name, _ in playbook.queue("gpu")]
    cpu = [name for name, _ in playbook.queue("cpu")]
    assert gpu == [fields[0].strip() for fields in lines if "gpu" in fields[1].split()]
    assert cpu == [fields[0].strip() for fields in lines if "cpu" in fields[1].split()]
    own_data = {name for name, arguments in playbook.queue("cpu") if "--data-dir" in arguments}
    assert set(cpu) - own_data <= set(gpu)  # the GPU carries the PNG copy alone
    assert dict(playbook.queue("gpu"))["paper-resnet164"] == [
        "--config",
        "cifar10_paper",
        "--model",
        "resnet164",
        "--set",
        "dataset=folder",
    ]


def test_a_finished_second_seed_lands_into_its_networks_entry():
    """A run the queue names `zoo-<model>-seed<k>` lands with --another-seed (its errors join
    the shipped network's entry); every other zoo run lands as the network, and every
    `-seed` run of the queue is a zoo network's."""
    summary = {"training_images_per_second": 1234.5}
    command = playbook.landing_command("zoo-resnet20", "/runs/zoo-resnet20", "resnet20", summary, "/data")
    assert command[1:] == [
        "-m",
        "scripts.land_zoo_run",
        "/runs/zoo-resnet20",
        "--name",
        "resnet20",
        "--images-per-second",
        "1234.5",
        "--data-dir",
        "/data",
    ]
    seed = playbook.landing_command("zoo-resnet56_original-seed1", "/runs/s", "resnet56_original", summary, "/data")
    assert seed[3:] == [
        "/runs/s",
        "--name",
        "resnet56_original",
        "--images-per-second",
        "1234.5",
        "--data-dir",
        "/data",
        "--another-seed",
    ]
    seeds = [(name, arguments) for name, arguments in playbook.queue("gpu") if "-seed" in name]
    assert seeds and all(name.startswith("zoo-") and "seed=1" in arguments for name, arguments in seeds)


def test_the_cpu_queue_runs_its_entries_in_order(tmp_path):
    """scripts/zoo_queue.sh with a Python that records its arguments and finishes each run:
    every "cpu" run of scripts/queue.txt once, in order, with the data and run folders."""
    recorder = tmp_path / "python"
    recorder.write_text('#!/bin/sh\necho "$@" >> "$RUNS/calls"\nfor last; do :; done\necho {} > "$last/summary.json"\n')
    recorder.chmod(0o755)
    environment = dict(
        os.environ, RUNS=str(tmp_path / "runs"), DATA="/data", PYTHON=str(recorder), CARRIED=str(tmp_path / "carried")
    )
    first = tmp_path / "runs" / playbook.queue("cpu")[0][0]
    first.mkdir(parents=True)
    (first / "summary.json").write_text("{}")  # finished: skipped
    subprocess.run([os.path.join(ROOT, "scripts", "zoo_queue.sh")], env=environment, check=True, timeout=60)
    calls = (tmp_path / "runs" / "calls").read_text().splitlines()
    expected = [
        f"-m keras_preact_training train {' '.join(os.path.expanduser(argument) for argument in arguments)}"
        + ("" if "--data-dir" in arguments else " --data-dir /data")  # a run's own data folder kept
        + f" --run-dir {tmp_path / 'runs' / name}"
        for name, arguments in playbook.queue("cpu")[1:]
    ]
    assert calls == expected


def test_the_cpu_queue_reads_its_file_again_after_each_run_and_keeps_a_runs_own_data(tmp_path):
    """A run added to queue.txt while another trains is taken next without a restart; a run
    whose arguments name --data-dir reads that folder, not the queue's, with ~ as the home."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(os.path.join(ROOT, "scripts", "zoo_queue.sh"), tmp_path / "scripts")
    queue = tmp_path / "scripts" / "queue.txt"
    queue.write_text("# a comment\nfirst | cpu gpu | --config a\nelsewhere | gpu | --config b\n")
    recorder = tmp_path / "python"
    recorder.write_text(
        '#!/bin/sh\necho "$@" >> "$RUNS/calls"\nfor last; do :; done\necho {} > "$last/summary.json"\n'
        f'grep -q second {queue} || echo "second | cpu | --config c --data-dir ~/other" >> {queue}\n'
    )
    recorder.chmod(0o755)
    environment = dict(os.environ, RUNS=str(tmp_path / "runs"), DATA="/data", PYTHON=str(recorder), HOME="/home/a")
    subprocess.run([str(tmp_path / "scripts" / "zoo_queue.sh")], env=environment, check=True, timeout=60)
    assert (tmp_path / "runs" / "calls").read_text().splitlines() == [
        f"-m keras_preact_training train --config a --data-dir /data --run-dir {tmp_path / 'runs' / 'first'}",
        f"-m keras_preact_training train --config c --data-dir /home/a/other --run-dir {tmp_path / 'runs' / 'second'}",
    ]


def test_the_archive_travels_in_parts_each_kept_and_is_joined_once_checked(tmp_path):
    """The CIFAR-10 archive cut into parts of a call each; each part received by a call of its
    own (the working tree replaced between calls); joined, checked and extracted by `start`."""
    images = tmp_path / "source" / playbook.DATA_FOLDER
    for split in ("train", "test"):
        (images / split / "cat").mkdir(parents=True)
        (images / split / "cat" / "0000.png").write_bytes(np.random.default_rng(0).bytes(3000))
    archive = tmp_path / "cifar10-png.tar.xz"
    with tarfile.open(archive, "w:xz") as opened:
        opened.add(images, playbook.DATA_FOLDER)
    pack, parts, device = tmp_path / "pack", tmp_path / "tree" / ".gpu-data", tmp_path / "device"
    pack.mkdir()
    playbook.cut(str(archive), str(parts), 1000, str(pack))
    manifest = json.loads((pack / "data.json").read_text())
    assert manifest["parts"] == [f"part-{number}" for number in range(1, len(manifest["parts"]) + 1)]
    assert len(manifest["parts"]) == -(-archive.stat().st_size // 1000) >= 3
    assert b"".join((parts / name).read_bytes() for name in manifest["parts"]) == archive.read_bytes()
    carried = {name: (parts / name).read_bytes() for name in manifest["parts"]}
    with pytest.raises(SystemExit, match=r"parts \['part-1', 'part-2'"):
        playbook.assemble(str(device), str(pack))
    for name, content in carried.items():  # one call each: the tree holds that part alone
        shutil.rmtree(parts)
        parts.mkdir()
        (parts / name).write_bytes(content)
        playbook.receive(str(device), str(parts))
    folder = playbook.assemble(str(device), str(pack))
    assert folder == str(device / playbook.DATA_FOLDER)
    assert (device / playbook.DATA_FOLDER / "test" / "cat" / "0000.png").read_bytes() == (
        images / "test" / "cat" / "0000.png"
    ).read_bytes()
    assert sorted(os.listdir(device)) == [playbook.DATA_FOLDER]  # the parts and the joined archive gone
    assert playbook.assemble(str(device), str(pack)) == folder  # once a machine

    shutil.rmtree(device / playbook.DATA_FOLDER)
    for name, content in carried.items():
        (device / "parts").mkdir(exist_ok=True)
        (device / "parts" / name).write_bytes(content[::-1] if name == "part-2" else content)
    with pytest.raises(
        SystemExit, match="error: the joined cifar10-png.tar.xz has SHA-256 .*, not " + manifest["sha256"]
    ):
        playbook.assemble(str(device), str(pack))


ENVIRONMENT = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3")


def test_the_runs_start_in_the_queues_order_as_many_at_once_as_asked(tmp_path, monkeypatch):
    """Runs that stop at once (an unknown config): the first, then, once it has stopped, the second."""
    monkeypatch.setattr(playbook, "REPORT_SECONDS", 0.2)
    entries = [(name, ["--config", "no_such_config"]) for name in ("first", "second")]
    device = tmp_path / "device"
    playbook.start(
        0, str(tmp_path / "out"), device_root=str(device), entries=entries, packed=str(tmp_path / "pack"), concurrent=1
    )
    started = json.loads((device / "runs" / "processes.json").read_text())
    assert list(started) == ["first"]
    playbook.collect(2, str(tmp_path / "out"), device_root=str(device), entries=entries)
    assert list(json.loads((device / "runs" / "processes.json").read_text())) == ["first", "second"]
    assert "error: Unknown config" in (device / "runs" / "second" / "output.txt").read_text()
    assert sorted(os.listdir(tmp_path / "out")) == ["first.tar", "second.tar"]


def test_every_gpu_of_the_machine_takes_runs(tmp_path, monkeypatch):
    """On a machine of two GPUs (faked), four runs at once: two on each, in turn."""
    monkeypatch.setattr(playbook, "REPORT_SECONDS", 0.2)
    entries = [(f"run{index}", ["--config", "no_such_config"]) for index in range(4)]
    device = tmp_path / "device"
    playbook.start(
        0,
        str(tmp_path / "out"),
        device_root=str(device),
        entries=entries,
        packed=str(tmp_path / "pack"),
        concurrent=4,
        gpus=2,
    )
    assert json.loads((device / "runs" / "gpus.json").read_text()) == {"run0": 0, "run1": 1, "run2": 0, "run3": 1}
    assert json.loads((device / "runs" / "settings.json").read_text())["gpus"] == 2


def train(run_dir):
    result = subprocess.run(
        [KERAS_PREACT, "train", *SHORT_DIGITS_RUN, "--run-dir", str(run_dir)],
        cwd=ROOT,
        env=ENVIRONMENT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def wait_for(path):
    deadline = time.time() + 300
    while time.time() < deadline and not path.exists():
        time.sleep(0.05)
    assert path.exists(), f"no {path}"


def test_a_run_started_stopped_landed_and_resumed_on_the_cpu(tmp_path):
    """The playbook's whole cycle, its device steps run here under JAX: the CPU's first epoch
    packed, the run started from it in a process of its own, stopped after a checkpoint,
    bundled, landed in the CPU's run folder, and finished there by the CPU queue's command."""
    name, cpu_runs = "gpu-digits", tmp_path / "cpu"
    entries = [(name, SHORT_DIGITS_RUN)]
    cpu = subprocess.Popen(
        [KERAS_PREACT, "train", *SHORT_DIGITS_RUN, "--run-dir", str(cpu_runs / name)],
        cwd=ROOT,
        env=ENVIRONMENT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(cpu_runs / name / "checkpoints" / "ckpt-10.npz")
    cpu.kill()  # the CPU queue's run, stopped when the session ended
    cpu.wait()
    first = playbook.newest_checkpoint(str(cpu_runs / name))[0]
    playbook.pack(runs=str(cpu_runs), wheels=False, archive=None, output=str(tmp_path / "pack"), entries=entries)
    carried = tmp_path / "pack" / "runs" / name
    assert sorted(os.listdir(carried / "checkpoints")) == [f"ckpt-{first}.npz"] and first < 30

    device = tmp_path / "device"
    playbook.start(0, str(tmp_path / "out"), device_root=str(device), entries=entries, packed=str(tmp_path / "pack"))
    assert list(playbook.running(str(device))) == [name]
    wait_for(device / "runs" / name / "checkpoints" / "ckpt-30.npz")
    playbook.stop(str(device))
    while playbook.running(str(device)):
        time.sleep(0.1)
    assert not (device / "runs" / name / "summary.json").exists(), "the run finished before it was stopped"
    bundles = playbook.bundle(str(tmp_path / "out"), str(device / "runs"), entries)
    with tarfile.open(bundles[0]) as archive:
        members = sorted(archive.getnames())
    step = int(next(member for member in members if "ckpt-" in member).split("ckpt-")[1].split(".")[0])
    assert step >= 30 and members == sorted(["config.json", "log.csv", "output.txt", f"checkpoints/ckpt-{step}.npz"])
    assert "Resuming from" in (device / "runs" / name / "output.txt").read_text()

    playbook.land(str(tmp_path / "out"), runs=str(cpu_runs), data_dir="/data/here", publish=False)
    assert playbook.newest_checkpoint(str(cpu_runs / name))[0] == step
    assert json.loads((cpu_runs / name / "config.json").read_text())["data_dir"] == "/data/here"
    resumed = train(cpu_runs / name)
    landed = cpu_runs / name / "checkpoints" / f"ckpt-{step}.npz"
    assert f"Resuming from {landed} at step {step} of 44." in resumed.stdout
    train(tmp_path / "whole")
    summaries = [json.loads((folder / "summary.json").read_text()) for folder in (cpu_runs / name, tmp_path / "whole")]
    assert summaries[0]["weights_sha256"] == summaries[1]["weights_sha256"]


@pytest.mark.tensorflow
def test_pack_carries_a_tensorflow_checkpoint_as_npz(tmp_path):
    """A run of the CPU queue checkpointed in TensorFlow's format travels as .npz (the device has no TensorFlow)."""
    import tensorflow as tf

    run_dir = tmp_path / "cpu" / "legacy"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.json").write_text("{}")
    values = {
        "model": {"0:dense.kernel": tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3))},
        "optimizer": {"0:sgd.iteration": tf.Variable(np.int64(390))},
    }
    tf.train.Checkpoint(**values).write(str(run_dir / "checkpoints" / "ckpt-390"))
    playbook.pack(
        runs=str(tmp_path / "cpu"), wheels=False, archive=None, output=str(tmp_path / "pack"), entries=[("legacy", [])]
    )
    with np.load(tmp_path / "pack" / "runs" / "legacy" / "checkpoints" / "ckpt-390.npz") as carried:
        np.testing.assert_array_equal(carried["model/0:dense.kernel"], np.arange(6).reshape(2, 3))
        assert int(carried["optimizer/0:sgd.iteration"]) == 390
