"""The CPU queue's unfinished runs, carried in the repository from one machine to the next.

A session's machine may come back without ~/.cache, and with it the queue's run folders: a run
longer than a session (a ResNet-110 trains about 4 hours alone here, a session has 3) would
then start again from its first step every session and never finish. So the session that
stops the queue writes each run it has begun and not finished into scripts/carried/, and
commits it with its closing work:

    .venv/bin/python -m scripts.carry_runs save     # once the queue has stopped; commit scripts/carried/

`<name>.tar` is the run's newest checkpoint (every variable of the network and its optimizer:
the run goes on as if never stopped), config, log and its output's tail, as the GPU playbook
brings runs back from a device (about 14 MB for a ResNet-110 or a ResNet-164). The next
session's scripts/zoo_queue.sh restores each into its run folder where it is further on than
the folder's own (`restore`), and the run resumes from the carried step. A tar leaves the
repository in the commit that lands its run (scripts/land_zoo_run.py deletes it).

A carried run keeps the precision it began in (`precision=auto` resolves once, when a run
begins: keras_preact_training/train/precision.py): one begun in mixed_bfloat16 and carried to a processor
without bfloat16 arithmetic resumes emulating it there, about six times slower than float32
(docs/benchmarks.md, "Which processor"). Such a machine trains it on faster in float32 with
`--set precision=float32 --allow-config-changes` added to its line of scripts/queue.txt (the
run's config then records float32; say where it lands which steps trained in which).
"""

import argparse
import os
import tarfile

from scripts import gpu_playbook as playbook

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CARRIED = os.path.join(ROOT, "scripts", "carried")


def carried_step(path):
    """The step of the checkpoint the carried tar `path` holds."""
    with tarfile.open(path) as archive:
        return max(int(member.split("ckpt-")[1].split(".")[0]) for member in archive.getnames() if "ckpt-" in member)


def save(runs=playbook.CPU_RUNS, carried=CARRIED, entries=None):
    """Writes each run of `entries` (the CPU queue's) that `runs` holds begun and not finished
    as `carried/<name>.tar`, unless the tar there is further on (or this machine has not begun
    the run); deletes the tars of runs finished here or no longer queued. Returns the names
    carried."""
    entries = playbook.queue("cpu") if entries is None else entries
    os.makedirs(carried, exist_ok=True)
    kept = []
    for name, arguments in entries:
        run_dir = os.path.join(runs, name)
        if os.path.exists(os.path.join(run_dir, "summary.json")):
            continue
        step, _ = playbook.newest_checkpoint(run_dir)
        path = os.path.join(carried, f"{name}.tar")
        there = carried_step(path) if os.path.exists(path) else None
        if there is not None and (step is None or there > step):
            kept.append(name)
            print(f"{name}: the carried checkpoint (step {there}) is further on than {run_dir}'s; kept")
        elif step is not None:
            kept.append(name)
            playbook.bundle(carried, runs, [(name, arguments)])
    for leftover in sorted(set(os.listdir(carried)) - {f"{name}.tar" for name in kept}):
        if leftover.endswith(".tar"):
            os.remove(os.path.join(carried, leftover))
            print(f"{leftover[: -len('.tar')]}: finished here or no longer queued; its carried tar deleted")
    return kept


def forget(run_dir, carried=CARRIED):
    """Deletes the carried tar of the run `run_dir` (a folder named as the run), if there is one."""
    path = os.path.join(carried, f"{os.path.basename(os.path.normpath(run_dir))}.tar")
    if os.path.exists(path):
        os.remove(path)
        print(f"{path}: deleted (the run has landed)")


def restore(carried=CARRIED, runs=playbook.CPU_RUNS, data_dir=playbook.CPU_DATA):
    """Puts each carried run's checkpoint, config and log into `runs/<name>` where it is
    further on than the folder's own, with this machine's `data_dir` in its config."""
    if os.path.isdir(carried):
        playbook.land(carried, runs=runs, data_dir=data_dir, publish=False)


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    commands = parser.add_subparsers(dest="command", required=True)
    saving = commands.add_parser("save", help="the queue's begun, unfinished runs into the carried folder")
    restoring = commands.add_parser("restore", help="the carried runs into the queue's run folders")
    for command in (saving, restoring):
        command.add_argument("--carried", default=CARRIED, help=f"the carried runs (default: {CARRIED})")
        command.add_argument(
            "--runs", default=playbook.CPU_RUNS, help=f"the queue's runs (default: {playbook.CPU_RUNS})"
        )
    restoring.add_argument("--data-dir", default=playbook.CPU_DATA, help="CIFAR-10 as PNG folders here")
    arguments = parser.parse_args()
    if arguments.command == "save":
        save(arguments.runs, arguments.carried)
    else:
        restore(arguments.carried, arguments.runs, arguments.data_dir)


if __name__ == "__main__":
    main()
