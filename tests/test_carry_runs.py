"""scripts/carry_runs.py: the CPU queue's unfinished runs carried in the repository to a machine
without ~/.cache, and scripts/zoo_queue.sh restoring them before it trains."""

import json
import os
import shutil
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from scripts import carry_runs

pytestmark = pytest.mark.commands
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRIES = [("begun", ["--config", "a"]), ("finished", ["--config", "b"]), ("not-begun", ["--config", "c"])]


def make_run(run_dir, steps, finished=False):
    """A run folder as `keras-preact train` leaves it: checkpoints of `steps`, config, log, output."""
    (run_dir / "checkpoints").mkdir(parents=True)
    for step in steps:
        np.savez(run_dir / "checkpoints" / f"ckpt-{step}.npz", **{"model/0:dense.kernel": np.full(3, step, np.float32)})
    (run_dir / "config.json").write_text(json.dumps({"model": "resnet20", "data_dir": "/data/there"}))
    (run_dir / "log.csv").write_text(f"step,loss\n{steps[-1]},1.5\n")
    (run_dir / "output.txt").write_text("x" * 100_000 + "the end")
    if finished:
        (run_dir / "summary.json").write_text("{}")


def test_the_begun_runs_are_carried_and_restored_on_a_machine_without_them(tmp_path):
    """`save` carries the newest checkpoint, config, log and output's tail of each begun,
    unfinished run, and no other; `restore` puts them into empty run folders, with this
    machine's data folder in the config, and keeps a run folder that is as far on."""
    runs, carried = tmp_path / "runs", tmp_path / "carried"
    make_run(runs / "begun", [78, 156, 234])
    make_run(runs / "finished", [78], finished=True)
    assert carry_runs.save(str(runs), str(carried), ENTRIES) == ["begun"]
    assert sorted(os.listdir(carried)) == ["begun.tar"]
    with tarfile.open(carried / "begun.tar") as archive:
        assert sorted(archive.getnames()) == ["checkpoints/ckpt-234.npz", "config.json", "log.csv", "output.txt"]
        tail = archive.extractfile("output.txt").read()
    assert len(tail) == 64 * 2**10 and tail.endswith(b"the end")

    other_machine = tmp_path / "other"
    carry_runs.restore(str(carried), str(other_machine), data_dir="/data/here")
    assert sorted(os.listdir(other_machine / "begun" / "checkpoints")) == ["ckpt-234.npz"]
    with np.load(other_machine / "begun" / "checkpoints" / "ckpt-234.npz") as restored:
        np.testing.assert_array_equal(restored["model/0:dense.kernel"], [234, 234, 234])
    assert json.loads((other_machine / "begun" / "config.json").read_text()) == {
        "model": "resnet20",
        "data_dir": "/data/here",
    }
    assert (other_machine / "begun" / "log.csv").read_text() == "step,loss\n234,1.5\n"

    (other_machine / "begun" / "log.csv").write_text("step,loss\n312,1.2\n")  # trained on here
    np.savez(other_machine / "begun" / "checkpoints" / "ckpt-312.npz", **{"model/0:dense.kernel": np.zeros(3)})
    carry_runs.restore(str(carried), str(other_machine), data_dir="/data/here")
    assert (other_machine / "begun" / "log.csv").read_text() == "step,loss\n312,1.2\n"


def test_a_carried_run_further_on_is_kept_and_a_landed_ones_tar_leaves(tmp_path, capsys):
    """A machine whose run is behind the carried one, or that has not begun it, does not
    replace it; the tar of a run that has finished, or that the queue no longer holds, is
    deleted; `forget` deletes a landed run's tar."""
    runs, carried = tmp_path / "runs", tmp_path / "carried"
    make_run(tmp_path / "elsewhere" / "begun", [390])
    carry_runs.save(str(tmp_path / "elsewhere"), str(carried), ENTRIES)
    assert carry_runs.save(str(runs), str(carried), ENTRIES) == ["begun"]  # nothing begun here
    assert carry_runs.carried_step(str(carried / "begun.tar")) == 390
    make_run(runs / "begun", [78])
    make_run(runs / "finished", [78])
    carry_runs.save(str(runs), str(carried), ENTRIES)
    assert carry_runs.carried_step(str(carried / "begun.tar")) == 390
    assert "begun: the carried checkpoint (step 390) is further on than" in capsys.readouterr().out
    (carried / "gone.tar").write_bytes(b"")
    (runs / "finished" / "summary.json").write_text("{}")
    assert carry_runs.save(str(runs), str(carried), ENTRIES) == ["begun"]
    assert sorted(os.listdir(carried)) == ["begun.tar"]
    carry_runs.forget(str(runs / "begun") + "/", str(carried))
    assert os.listdir(carried) == []


def test_the_queue_restores_the_carried_runs_before_it_trains(tmp_path):
    """scripts/zoo_queue.sh, with a carried run and a Python that records the training
    command: the run's folder holds the carried checkpoint when its training starts."""
    (tmp_path / "scripts").mkdir()
    for script in ("__init__.py", "zoo_queue.sh", "carry_runs.py", "gpu_playbook.py"):
        shutil.copy(os.path.join(ROOT, "scripts", script), tmp_path / "scripts")
    for package in ("keras_preact", "keras_preact_training"):
        os.symlink(os.path.join(ROOT, package), tmp_path / package)
    (tmp_path / "scripts" / "queue.txt").write_text("begun | cpu gpu | --config a\n")
    make_run(tmp_path / "elsewhere" / "begun", [78, 156])
    carry_runs.save(str(tmp_path / "elsewhere"), str(tmp_path / "scripts" / "carried"), [("begun", [])])
    recorder = tmp_path / "python"
    recorder.write_text(
        f'#!/bin/sh\n[ "$2" = scripts.carry_runs ] && exec {sys.executable} "$@"\n'
        'for last; do :; done\nls "$last/checkpoints" >> "$RUNS/calls"\necho {} > "$last/summary.json"\n'
    )
    recorder.chmod(0o755)
    runs = tmp_path / "runs"
    environment = dict(os.environ, RUNS=str(runs), DATA="/data/here", PYTHON=str(recorder))
    subprocess.run([str(tmp_path / "scripts" / "zoo_queue.sh")], env=environment, check=True, timeout=120)
    assert (runs / "calls").read_text() == "ckpt-156.npz\n"
    assert json.loads((runs / "begun" / "config.json").read_text())["data_dir"] == "/data/here"
    assert "begun: the checkpoint of step 156 from" in (runs / "queue.log").read_text()
