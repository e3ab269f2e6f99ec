"""The GPU playbook: the zoo's queue trained on a lent GPU machine (the `device` tool) under JAX,
its checkpoints and finished networks brought back and landed here.

A session lent a GPU runs it first, in this order, with nothing else between the device calls
(a device machine goes back 30 s after a call ends, and a session has 15 minutes of it):

    python -m scripts.gpu_playbook pack                        # here: .gpu/, what the device lacks
    run: python3 -m scripts.gpu_playbook receive               # device, carry [".gpu-data/part-1"]
    ...                                                        # each part in turn (pack prints the calls)
    run: python3 -m scripts.gpu_playbook start --minutes 8     # device, carry [".gpu"]: starts the queue
    run: python3 -m scripts.gpu_playbook collect --minutes 3   # device, again within 30 s (as time allows)
    python -m scripts.gpu_playbook land FILES_AT               # here, after each call: checkpoints, networks

`pack` fills the ignored folder `.gpu/` with what the device machine lacks: Keras and its
dependencies that are not there (wheels for its Python 3.12), and the newest checkpoint of
each queued run that this machine's CPU queue has begun (TensorFlow-format checkpoints
converted to `.npz`), as many as the 64 MiB a call carries allows. `../shared/data` does not
travel, and the CIFAR-10 archive (`cifar10-png.tar.xz`, 137 MB) is larger than a call carries:
`pack` cuts it into parts that each fit one call beside the working tree (`.gpu-data/part-N`,
its SHA-256 in `.gpu/data.json`), and `receive` moves each carried part out of the working
tree, which the next call replaces, into the device's `/tmp/keras-preact/parts`, which stays
while the machine does.

`start` joins the parts, checks the archive's SHA-256 and extracts the images (once a
machine), installs the wheels, and starts the first CONCURRENT runs of
`scripts/queue.txt` marked "gpu" that have not finished, in the queue's order, together on the
one GPU (the next starts as one finishes), each a `keras-preact train` under JAX (NumPy's
input pipeline; no TensorFlow there) in a process of its own session, which outlives the
10-minute command; each resumes from its carried checkpoint and checkpoints every epoch.
`start` and `collect` wait `--minutes` (reporting each run's progress every minute), then
write one bundle a run into $OUT (a tar of its newest checkpoint, log and config, or of its
finished network, summary and curves: at most 8 files of 16 MiB come back a call). `stop`
ends the runs.

`land` puts each bundle's checkpoint into the CPU queue's run folder
(~/.cache/keras-preact/runs/<name>) where it is further on than the CPU's, restarting the CPU
queue if it is training that run, so that whatever is unfinished resumes on the CPU from the
GPU's step; a finished zoo network lands at once (`scripts/land_zoo_run.py`).
"""

import argparse
import glob
import importlib.metadata
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUEUE_FILE = os.path.join(ROOT, "scripts", "queue.txt")
PACK = os.path.join(ROOT, ".gpu")
PARTS = os.path.join(ROOT, ".gpu-data")
ARCHIVE = os.path.join(ROOT, "..", "shared", "data", "cifar10-png.tar.xz")
# The image folder the archive holds, as the CPU queue keeps it and as the device extracts it.
DATA_FOLDER = "cifar10-png"
CPU_RUNS = os.path.expanduser("~/.cache/keras-preact/runs")
CPU_DATA = os.path.expanduser(f"~/.cache/keras-preact/{DATA_FOLDER}")
# What the device machine's Python (3.12, with JAX, NumPy, Pillow, h5py, matplotlib, rich,
# absl-py, ml-dtypes and scikit-learn) lacks of Keras' and keras-preact's needs.
WHEELS = ("keras", "namex", "optree")
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# The device tool's limits: what a call carries (the working tree and carried folders) and
# brings back (files of $OUT).
CARRY_BYTES = 64 * 2**20
CARRY_MARGIN_BYTES = 4 * 2**20
RETURN_FILE_BYTES = 16 * 2**20
RETURN_FILES = 8
# Where the device keeps its runs and data, outside the working tree, which each call replaces.
DEVICE_ROOT = "/tmp/keras-preact"
# Runs trained at once on the one GPU (the queue's first unfinished ones; the next starts as
# one finishes), and the GPU's memory they share (JAX takes 75 % a process by default).
CONCURRENT = 4
GPU_MEMORY_SHARE = 0.9
# How often `collect` reports the runs' progress and starts the next.
REPORT_SECONDS = 60
# A run's files that a bundle carries, with its newest checkpoint or its finished network's
# files, and the end of its output (whose progress bar grows by about 7 MB in 60 epochs).
RUN_FILES = ("config.json", "log.csv")
FINISHED_FILES = ("summary.json", "model.keras", "curves.png")
OUTPUT_TAIL_BYTES = 64 * 2**10


def queue(where):
    """[(name, [arguments])] of scripts/queue.txt's runs that `where` ("cpu" or "gpu") takes, in order."""
    entries = []
    with open(QUEUE_FILE) as file:
        for line in file:
            if line.strip() and not line.startswith("#"):
                name, runners, arguments = (part.strip() for part in line.split("|"))
                if where in runners.split():
                    entries.append((name, arguments.split()))
    return entries


def newest_checkpoint(run_dir):
    """(step, path) of the newest checkpoint of `run_dir`, .npz or TensorFlow's, or (None, None)."""
    from keras_preact_training.train import checkpoints

    return next(iter(checkpoints.newest_first(os.path.join(run_dir, "checkpoints"))), (None, None))


def working_tree_bytes():
    """The bytes of what a device call sends besides carried folders: tracked and untracked, not ignored, files."""
    names = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True, capture_output=True
        )
        .stdout.decode()
        .split("\0")
    )
    return sum(
        os.path.getsize(os.path.join(ROOT, name)) for name in names if name and os.path.isfile(os.path.join(ROOT, name))
    )


def pack(runs=CPU_RUNS, wheels=True, archive=ARCHIVE, output=PACK, entries=None, parts=PARTS):
    """Fills `output` (.gpu/) with the wheels and the newest checkpoints of the queued runs
    (`entries`; scripts/queue.txt's "gpu" runs by default), and `parts` (.gpu-data/) with the
    CIFAR-10 archive cut into parts of a call each (`archive` None: none)."""
    from keras_preact_training.train import checkpoints

    shutil.rmtree(output, ignore_errors=True)
    os.makedirs(os.path.join(output, "runs"))
    if wheels:
        requirements = [f"{name}=={importlib.metadata.version(name)}" for name in WHEELS]
        platforms = [option for platform in WHEEL_PLATFORMS for option in ("--platform", platform)]
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                "3.12",
                "--implementation",
                "cp",
                *platforms,
                "-d",
                os.path.join(output, "wheels"),
                *requirements,
            ],
            check=True,
        )
    if archive is not None:
        if not os.path.isfile(archive):
            raise SystemExit(f"error: the CIFAR-10 archive is not at {archive} (../shared/data/README.md)")
        cut(archive, parts, CARRY_BYTES - CARRY_MARGIN_BYTES - working_tree_bytes(), output)
    budget = CARRY_BYTES - CARRY_MARGIN_BYTES - working_tree_bytes() - folder_bytes(output)
    for name, _ in queue("gpu") if entries is None else entries:
        run_dir = os.path.join(runs, name)
        if os.path.exists(os.path.join(run_dir, "summary.json")):
            print(f"{name}: finished on the CPU; not carried")
            continue
        step, path = newest_checkpoint(run_dir)
        if step is None:
            print(f"{name}: no checkpoint here; starts from its first step on the GPU")
            continue
        values = checkpoints.read_values(path)
        size = sum(value.nbytes for value in values.values())
        if size > budget:
            print(
                f"{name}: its checkpoint at step {step} ({size / 2**20:.1f} MiB) does not fit the "
                f"{max(budget, 0) / 2**20:.1f} MiB left of a call's 64 MiB; starts from its first step on the GPU"
            )
            continue
        carried = os.path.join(output, "runs", name)
        checkpoints.save(os.path.join(carried, "checkpoints"), step, values)
        for file in ("config.json", "log.csv"):
            if os.path.exists(os.path.join(run_dir, file)):
                shutil.copy(os.path.join(run_dir, file), carried)
        budget -= size
        print(f"{name}: carries its checkpoint at step {step} ({size / 2**20:.1f} MiB)")
    print(
        f"{output}: {folder_bytes(output) / 2**20:.1f} MiB, the working tree {working_tree_bytes() / 2**20:.1f} MiB "
        f"(a call carries 64 MiB)"
    )


def cut(archive, parts, part_bytes, output):
    """`archive` as consecutive parts of at most `part_bytes` in `parts` (part-1, part-2, ...),
    and `output`/data.json naming them with the whole archive's SHA-256; prints the device
    calls that carry them."""
    import hashlib

    shutil.rmtree(parts, ignore_errors=True)
    os.makedirs(parts)
    digest, names = hashlib.sha256(), []
    with open(archive, "rb") as source:
        while chunk := source.read(part_bytes):
            digest.update(chunk)
            names.append(f"part-{len(names) + 1}")
            with open(os.path.join(parts, names[-1]), "wb") as part:
                part.write(chunk)
    with open(os.path.join(output, "data.json"), "w") as file:
        json.dump(dict(archive=os.path.basename(archive), sha256=digest.hexdigest(), parts=names), file)
    for name in names:
        print(f'run: python3 -m scripts.gpu_playbook receive   carry: ["{os.path.basename(parts)}/{name}"]')


def receive(device_root=DEVICE_ROOT, parts=PARTS):
    """On the device: the parts carried by this call moved out of the working tree into
    `device_root`/parts, where the next calls find them."""
    folder = os.path.join(device_root, "parts")
    os.makedirs(folder, exist_ok=True)
    for name in sorted(os.listdir(parts)) if os.path.isdir(parts) else []:
        shutil.move(os.path.join(parts, name), os.path.join(folder, name))
        print(f"{name}: received ({os.path.getsize(os.path.join(folder, name)) / 2**20:.1f} MiB)")
    print(f"parts here: {sorted(os.listdir(folder))}")


def assemble(device_root, packed):
    """On the device: the image folder, extracted once from the parts `receive` kept, joined in
    order and checked against the SHA-256 of `packed`/data.json. Returns its path.

    Raises:
        SystemExit: naming the parts missing, or a joined archive that is not the one packed.
    """
    import hashlib

    folder = os.path.join(device_root, DATA_FOLDER)
    if os.path.isdir(folder):
        return folder
    with open(os.path.join(packed, "data.json")) as file:
        manifest = json.load(file)
    received = os.path.join(device_root, "parts")
    missing = [name for name in manifest["parts"] if not os.path.isfile(os.path.join(received, name))]
    if missing:
        raise SystemExit(
            f"error: parts {missing} of {manifest['archive']} were not received: carry each to `receive` first"
        )
    archive, digest = os.path.join(device_root, manifest["archive"]), hashlib.sha256()
    with open(archive, "wb") as joined:
        for name in manifest["parts"]:
            with open(os.path.join(received, name), "rb") as part:
                while chunk := part.read(2**24):
                    digest.update(chunk)
                    joined.write(chunk)
    if digest.hexdigest() != manifest["sha256"]:
        raise SystemExit(
            f"error: the joined {manifest['archive']} has SHA-256 {digest.hexdigest()}, not {manifest['sha256']}"
        )
    with tarfile.open(archive) as opened:
        opened.extractall(device_root, filter="data")
    os.remove(archive)
    shutil.rmtree(received)
    return folder


def folder_bytes(folder):
    return sum(
        os.path.getsize(os.path.join(directory, file)) for directory, _, files in os.walk(folder) for file in files
    )


def visible_gpus():
    """How many NVIDIA GPUs the machine has (`nvidia-smi -L`'s lines; 0 where it has none)."""
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in listed.splitlines())


def start(
    minutes,
    out,
    device_root=DEVICE_ROOT,
    entries=None,
    backend="jax",
    packed=PACK,
    concurrent=CONCURRENT,
    gpus=None,
):
    """On the device: installs the wheels of `packed`, joins and extracts the images (`assemble`,
    where `packed` names an archive's parts), starts the first
    `concurrent` unfinished runs (each from its carried checkpoint), waits `minutes` while
    starting the next as runs finish, then writes the bundles to `out`."""
    entries = queue("gpu") if entries is None else entries
    wheels = sorted(glob.glob(os.path.join(packed, "wheels", "*.whl")))
    if wheels:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--no-cache-dir",
                "--upgrade",
                "--target",
                os.path.join(device_root, "site"),
                *wheels,
            ],
            check=True,
        )
    if os.path.exists(os.path.join(packed, "data.json")):
        assemble(device_root, packed)
    os.makedirs(os.path.join(device_root, "runs"), exist_ok=True)
    for name, _ in entries:
        carried, run_dir = os.path.join(packed, "runs", name), os.path.join(device_root, "runs", name)
        if os.path.isdir(carried) and not os.path.isdir(run_dir):
            shutil.copytree(carried, run_dir)
    gpus = visible_gpus() if gpus is None else gpus
    with open(os.path.join(device_root, "runs", "settings.json"), "w") as file:
        json.dump(dict(backend=backend, concurrent=concurrent, gpus=gpus), file)
    return collect(minutes, out, device_root, entries)


def fill(device_root, entries):
    """Starts the next unfinished, unstarted runs of `entries`, in order, until `concurrent`
    (`start`'s) run; each a `keras-preact train` in a session of its own, which outlives the
    command that starts it. Where the machine has several GPUs, every one is used: each run
    goes to the GPU that the fewest running runs share (`CUDA_VISIBLE_DEVICES`), with its
    share of that GPU's memory."""
    runs = os.path.join(device_root, "runs")
    with open(os.path.join(runs, "settings.json")) as file:
        settings = json.load(file)
    path = os.path.join(runs, "processes.json")
    processes = {}
    if os.path.exists(path):
        with open(path) as file:
            processes = json.load(file)
    site = os.path.join(device_root, "site")
    gpus = settings.get("gpus", 0)
    sharing = -(-settings["concurrent"] // max(gpus, 1))  # runs on one GPU at most
    environment = dict(
        os.environ,
        KERAS_BACKEND=settings["backend"],
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(
            [site, source_packages(device_root)] if os.path.isdir(site) else [source_packages(device_root)]
        ),
        XLA_PYTHON_CLIENT_MEM_FRACTION=f"{GPU_MEMORY_SHARE / sharing:.3f}",
    )
    placements_path = os.path.join(runs, "gpus.json")
    placements = {}
    if os.path.exists(placements_path):
        with open(placements_path) as file:
            placements = json.load(file)
    for name, arguments in entries:
        run_dir = os.path.join(runs, name)
        if len(running(device_root)) >= settings["concurrent"]:
            break
        if name in processes or os.path.exists(os.path.join(run_dir, "summary.json")):
            continue
        os.makedirs(run_dir, exist_ok=True)
        if gpus > 1:
            alive = running(device_root)
            load = [sum(placements.get(other) == gpu for other in alive) for gpu in range(gpus)]
            placements[name] = load.index(min(load))
            environment["CUDA_VISIBLE_DEVICES"] = str(placements[name])
            with open(placements_path, "w") as file:
                json.dump(placements, file)
        with open(os.path.join(run_dir, "output.txt"), "ab") as output:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "keras_preact_training",
                    "train",
                    *arguments,
                    "--data-dir",
                    os.path.join(device_root, DATA_FOLDER),
                    "--run-dir",
                    run_dir,
                ],
                cwd=ROOT,
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        processes[name] = process.pid
        with open(path, "w") as file:
            json.dump(processes, file)
        where = f" on GPU {placements[name]}" if name in placements else ""
        print(f"{name}: started (pid {process.pid}){where}: {' '.join(arguments)}")


def source_packages(device_root):
    """A folder of `device_root` in which the working tree's packages have their installed names
    (`keras_preact_training/` is `keras_preact_training`, as pyproject.toml installs it), for PYTHONPATH on a
    device where keras-preact is not installed."""
    folder = os.path.join(device_root, "packages")
    os.makedirs(folder, exist_ok=True)
    for name, source in (("keras_preact", "keras_preact"), ("keras_preact_training", "training")):
        link = os.path.join(folder, name)
        if not os.path.islink(link):
            os.symlink(os.path.join(ROOT, source), link)
    return folder


def running(device_root=DEVICE_ROOT):
    """{name: pid} of the runs `start` started that are still running."""
    path = os.path.join(device_root, "runs", "processes.json")
    if not os.path.exists(path):
        return {}
    with open(path) as file:
        processes = json.load(file)
    alive = {}
    for name, pid in processes.items():
        try:
            finished, _ = os.waitpid(pid, os.WNOHANG)  # reaps a child of this process that ended
        except ChildProcessError:  # started by an earlier call: not this process's child
            finished = 0 if os.path.exists(f"/proc/{pid}") and not zombie(pid) else pid
        if not finished:
            alive[name] = pid
    return alive


def zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def collect(minutes, out, device_root=DEVICE_ROOT, entries=None):
    """On the device: waits `minutes` (or until no run is left), printing each run's progress
    every minute, then writes a bundle of each run to `out`."""
    entries = queue("gpu") if entries is None else entries
    fill(device_root, entries)
    deadline = time.time() + 60 * minutes
    while time.time() < deadline and running(device_root):
        time.sleep(min(REPORT_SECONDS, max(deadline - time.time(), 0)))
        fill(device_root, entries)
        report(device_root, entries)
    return bundle(out, os.path.join(device_root, "runs"), entries)


def report(device_root, entries):
    alive = running(device_root)
    for name, _ in entries:
        log = os.path.join(device_root, "runs", name, "log.csv")
        last = None
        if os.path.exists(log):
            with open(log) as file:
                last = file.read().splitlines()[-1].split(",")
        state = "running" if name in alive else "stopped"
        if os.path.exists(os.path.join(device_root, "runs", name, "summary.json")):
            state = "finished"
        print(
            f"{time.strftime('%H:%M:%S')} {name}: {state}"
            + (
                f", step {last[0]}, epoch {last[1]}, loss {float(last[2]):.3f}, {float(last[7]):.0f} images/s"
                if last and last[0] != "step"
                else ""
            )
        )


def bundle(out, runs, entries):
    """A tar of each run of `entries` in the folder `runs` into `out`: its finished network,
    summary and curves, or its newest checkpoint; each with its config, log and output's tail.
    Returns their paths."""
    os.makedirs(out, exist_ok=True)
    written = []
    for name, _ in entries[:RETURN_FILES]:
        run_dir = os.path.join(runs, name)
        if not os.path.isdir(run_dir):
            continue
        finished = os.path.exists(os.path.join(run_dir, "summary.json"))
        names = list(RUN_FILES) + (list(FINISHED_FILES) if finished else [])
        step, checkpoint = newest_checkpoint(run_dir)
        path = os.path.join(out, f"{name}.tar")
        with tarfile.open(path, "w") as archive:
            for file in names:
                if os.path.exists(os.path.join(run_dir, file)):
                    archive.add(os.path.join(run_dir, file), arcname=file)
            if os.path.exists(os.path.join(run_dir, "output.txt")):
                with open(os.path.join(run_dir, "output.txt"), "rb") as output:
                    output.seek(max(os.path.getsize(output.name) - OUTPUT_TAIL_BYTES, 0))
                    tail = output.read()
                member = tarfile.TarInfo("output.txt")
                member.size, member.mtime = len(tail), int(time.time())
                archive.addfile(member, io.BytesIO(tail))
            if checkpoint and not finished:
                archive.add(checkpoint, arcname=os.path.join("checkpoints", os.path.basename(checkpoint)))
        size = os.path.getsize(path)
        print(
            f"{name}: {'finished' if finished else f'step {step}'}, bundle {size / 2**20:.1f} MiB"
            + (" (over the 16 MiB a file may take back)" if size > RETURN_FILE_BYTES else "")
        )
        written.append(path)
    return written


def stop(device_root=DEVICE_ROOT):
    """Ends the runs `start` started (each resumes from its last checkpoint)."""
    for name, pid in running(device_root).items():
        os.killpg(pid, signal.SIGTERM)
        print(f"{name}: stopped (pid {pid})")


def land(folder, runs=CPU_RUNS, data_dir=CPU_DATA, publish=True):
    """Each bundle of `folder` (a device call's files): a finished run into `runs` and, for a zoo
    run, landed; an unfinished one's checkpoint into `runs/<name>` where it is further on than
    the CPU's, the CPU queue restarted if it trains that run."""
    restart = False
    for path in sorted(glob.glob(os.path.join(folder, "*.tar"))):
        name = os.path.basename(path)[: -len(".tar")]
        run_dir = os.path.join(runs, name)
        with tarfile.open(path) as archive:
            members = archive.getnames()
            finished = "summary.json" in members
            arrived = [int(member.split("ckpt-")[1].split(".")[0]) for member in members if "ckpt-" in member]
            here, _ = newest_checkpoint(run_dir)
            if not finished and (not arrived or (here is not None and here >= max(arrived))):
                print(f"{name}: the CPU's checkpoint (step {here}) is as far on; kept")
                continue
            restart |= stop_cpu_run(run_dir)
            os.makedirs(os.path.join(run_dir, "checkpoints"), exist_ok=True)
            archive.extractall(run_dir, filter="data")
        with open(os.path.join(run_dir, "config.json")) as file:
            config = json.load(file)
        config["data_dir"] = data_dir  # where this machine's images are (a resumable change)
        with open(os.path.join(run_dir, "config.json"), "w") as file:
            json.dump(config, file, indent=2)
        if not finished:
            print(f"{name}: the checkpoint of step {max(arrived)} from {path} in {run_dir}; the CPU queue resumes it")
            continue
        with open(os.path.join(run_dir, "summary.json")) as file:
            summary = json.load(file)
        print(f"{name}: finished on the GPU, test error {100 * summary['test_error']:.2f} %")
        if publish and name.startswith("zoo-"):
            subprocess.run(landing_command(name, run_dir, config["model"], summary, data_dir), check=True, cwd=ROOT)
    if restart:
        restart_cpu_queue()


def landing_command(name, run_dir, model, summary, data_dir):
    """The command that lands the finished zoo run `name` (scripts/land_zoo_run.py): a second
    seed (queue.txt's `zoo-<model>-seed<k>`) into its network's entry, any other as the network."""
    another_seed = ["--another-seed"] if re.fullmatch(r"zoo-.+-seed\d+", name) else []
    return [
        sys.executable,
        "-m",
        "scripts.land_zoo_run",
        run_dir,
        "--name",
        model,
        "--images-per-second",
        str(summary["training_images_per_second"]),
        "--data-dir",
        data_dir,
        *another_seed,
    ]


def stop_cpu_run(run_dir):
    """Ends the CPU queue's training of `run_dir`, if it runs (it checkpoints atomically, and
    resumes from its newest checkpoint); returns whether it ran."""
    found = subprocess.run(["pgrep", "-f", f"--run-dir {run_dir}$"], capture_output=True, text=True).stdout.split()
    for pid in found:
        os.kill(int(pid), signal.SIGTERM)
    for pid in found:
        while os.path.exists(f"/proc/{pid}"):
            time.sleep(0.5)
    return bool(found)


def restart_cpu_queue():
    """Starts scripts/zoo_queue.sh again from its runner clone, as each session does."""
    runner = os.path.expanduser("~/.cache/keras-preact/runner")
    environment = dict(os.environ, PYTHON=os.path.join(ROOT, ".venv", "bin", "python"))
    with open(os.path.expanduser("~/.cache/keras-preact/queue.out"), "ab") as output:
        subprocess.Popen(
            ["nohup", os.path.join(runner, "scripts", "zoo_queue.sh")],
            cwd=runner,
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    print(f"the CPU queue started again from {runner}")


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:2]),
    )
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="here: fill .gpu/ with what the device lacks")
    packing.add_argument("--runs", default=CPU_RUNS, help=f"the CPU queue's runs (default: {CPU_RUNS})")
    for name in ("start", "collect"):
        command = commands.add_parser(
            name, help="on the device: " + ("start the queue, wait, bundle" if name == "start" else "wait, bundle")
        )
        command.add_argument("--minutes", type=float, default=9.0, help="how long to wait before bundling")
        command.add_argument("--out", default=os.environ.get("OUT", "out"), help="where the bundles go (default: $OUT)")
        if name == "start":
            command.add_argument(
                "--concurrent",
                type=int,
                default=CONCURRENT,
                help=f"runs trained at once on the GPU (default: {CONCURRENT})",
            )
    commands.add_parser("receive", help="on the device: keep the archive's parts this call carried")
    commands.add_parser("stop", help="on the device: end the runs")
    landing = commands.add_parser("land", help="here: put a device call's bundles into the CPU queue's runs")
    landing.add_argument("folder", help="the device call's files (the reply's files_at)")
    landing.add_argument("--runs", default=CPU_RUNS)
    landing.add_argument("--data-dir", default=CPU_DATA, help="CIFAR-10 as PNG folders here")
    arguments = parser.parse_args()
    if arguments.command == "pack":
        pack(arguments.runs)
    elif arguments.command == "start":
        start(arguments.minutes, arguments.out, concurrent=arguments.concurrent)
    elif arguments.command == "collect":
        collect(arguments.minutes, arguments.out)
    elif arguments.command == "receive":
        receive()
    elif arguments.command == "stop":
        stop()
    else:
        land(arguments.folder, arguments.runs, arguments.data_dir)


if __name__ == "__main__":
    main()
