"""The CIFAR-10 image folder's one place and `keras-preact data`, which makes it from an archive;
commands that read an image folder refuse a missing or misshapen one at once, saying how a
folder is laid out and made; offline, a data set that would be downloaded fails at once."""

import io
import os
import pathlib
import pickle
import shutil
import signal
import stat
import subprocess
import tarfile
import time
import zipfile

import numpy as np
import pytest

from keras_preact_training.data import cifar10_folder
from tests.conftest import KERAS_PREACT, ROOT

SAMPLES = os.path.join(ROOT, "docs", "cifar10")
pytestmark = pytest.mark.commands


def sample_folder(root):
    """`root/{train,test}/<class>/<class>_0000.jpg`: the ten docs JPEGs in both splits."""
    for split in ("train", "test"):
        for name in sorted(os.listdir(SAMPLES)):
            if name.endswith(".jpg"):
                folder = root / split / name.rsplit("_", 1)[0]
                folder.mkdir(parents=True)
                shutil.copy(os.path.join(SAMPLES, name), folder / name)
    return root


def archive_of(folder, path, top=None):
    """A tar.xz or zip of `folder`'s contents, under the top folder `top` where given."""
    if str(path).endswith(".zip"):
        with zipfile.ZipFile(path, "w") as archive:
            for directory, _, files in os.walk(folder):
                for name in files:
                    relative = os.path.relpath(os.path.join(directory, name), folder)
                    archive.write(os.path.join(directory, name), os.path.join(top or "", relative))
    else:
        with tarfile.open(path, "w:xz") as archive:
            for entry in sorted(os.listdir(folder)):
                archive.add(folder / entry, os.path.join(top or "", entry))
    return str(path)


def run(*arguments):
    return subprocess.run([KERAS_PREACT, *arguments], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("name, top", [("images.tar.xz", "cifar10-png"), ("images.zip", None)])
def test_data_makes_the_folder_from_an_archive_once(tmp_path, name, top):
    archive = archive_of(sample_folder(tmp_path / "source"), tmp_path / name, top)
    destination = str(tmp_path / "cache" / "cifar10-png")
    made = run("data", archive, "--data-dir", destination)
    assert made.returncode == 0, made.stderr
    assert made.stdout == f"Made: {destination}, 10 training and 10 test images in 10 classes.\n"
    assert sorted(os.listdir(os.path.join(destination, "train"))) == sorted(os.listdir(tmp_path / "source" / "train"))
    assert sorted(os.listdir(tmp_path / "cache")) == ["cifar10-png"]  # no lock file, no mark beside it
    again = run("data", archive, "--data-dir", destination)
    assert again.stdout.startswith(f"Already made: {destination}, 10 training")


def test_data_writes_nothing_beside_its_folder(tmp_path):
    """Files of the user's named after the destination (a mark or a lock of its name) keep their
    bytes, whether the command makes the folder or finds it made; its mark is inside the folder."""
    archive = archive_of(sample_folder(tmp_path / "source"), tmp_path / "images.tar.xz")
    destination = tmp_path / "cache" / "cifar10-png"
    destination.parent.mkdir()
    theirs = {destination.parent / f"cifar10-png{suffix}": b"x" * 102 for suffix in (".done", ".lock", ".tmp")}
    for path, content in theirs.items():
        path.write_bytes(content)
    for _ in range(2):
        result = run("data", archive, "--data-dir", str(destination))
        assert result.returncode == 0, result.stderr
        assert {path: path.read_bytes() for path in theirs} == theirs
    assert sorted(os.listdir(destination)) == [cifar10_folder.MARK, "test", "train"]
    assert sorted(os.listdir(destination.parent)) == sorted(["cifar10-png", *(path.name for path in theirs)])


def test_a_folder_marked_done_beside_it_by_an_earlier_version_counts_as_made(tmp_path):
    """Folders made before the mark moved inside (`<folder>.done` beside them) are still the
    command's: found made, never extracted again."""
    folder = sample_folder(tmp_path / "cifar10-png")
    (tmp_path / "cifar10-png.done").write_text("")
    assert cifar10_folder.is_made(str(folder))
    archive = archive_of(sample_folder(tmp_path / "source"), tmp_path / "images.tar.xz")
    assert run("data", archive, "--data-dir", str(folder)).stdout.startswith(f"Already made: {folder}, 10 training")


def test_data_never_touches_a_folder_it_did_not_make(tmp_path):
    """A user's folder at --data-dir, with files of their own: left as it was, the command
    refused in one line; an empty folder is filled."""
    archive = archive_of(sample_folder(tmp_path / "source"), tmp_path / "images.tar.xz")
    destination = tmp_path / "mine"
    (destination / "train" / "cat").mkdir(parents=True)
    (destination / "notes.txt").write_text("a user's file")
    result = run("data", archive, "--data-dir", str(destination))
    assert result.returncode == 2
    assert result.stderr == (
        f"error: {destination} exists and was not made by `keras-preact data` (no .keras-preact-data in it): its files "
        f"are left as they are. Pass another --data-dir, or move it away first. Received: data_dir={str(destination)!r}\n"
    )
    assert (destination / "notes.txt").read_text() == "a user's file"
    assert sorted(os.listdir(destination)) == ["notes.txt", "train"] and not (tmp_path / "mine.done").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cifar10_folder.extract(archive, str(empty)) == str(empty)
    assert cifar10_folder.counts(str(empty)) == {"train": (10, 10), "test": (10, 10)}


def release_archive(path, images, labels, test_images, test_labels, names):
    """A `cifar-10-python.tar.gz` of CIFAR-10's release format (its pickled batches, protocol 2,
    bytes keys, rows of 1,024 red, green then blue values) holding the images given: the
    training images split over its five batches."""
    folder = path.parent / "cifar-10-batches-py"
    folder.mkdir()

    def write(name, batch):
        with open(folder / name, "wb") as file:
            pickle.dump(batch, file, protocol=2)

    write("batches.meta", {b"label_names": [name.encode() for name in names], b"num_vis": 3072})
    rows = images.transpose(0, 3, 1, 2).reshape(len(images), -1)
    for number, part in enumerate(np.array_split(np.arange(len(images)), 5), start=1):
        write(f"data_batch_{number}", {b"data": rows[part], b"labels": [int(labels[index]) for index in part]})
    test_rows = test_images.transpose(0, 3, 1, 2).reshape(len(test_images), -1)
    write("test_batch", {b"data": test_rows, b"labels": [int(label) for label in test_labels]})
    with tarfile.open(path, "w:gz") as archive:
        archive.add(folder, "cifar-10-batches-py")
    return str(path)


def test_data_makes_the_png_folder_from_the_official_python_release(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    names = ["airplane", "automobile", "bird"]
    images = rng.integers(0, 256, (12, 32, 32, 3), dtype=np.uint8)
    labels = np.array([2, 0, 0, 1, 2, 2, 0, 1, 1, 0, 2, 2])
    test_images = rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    archive = release_archive(tmp_path / "cifar-10-python.tar.gz", images, labels, test_images, [1, 0, 1, 2], names)
    destination = tmp_path / "cifar10-png"
    made = run("data", archive, "--data-dir", str(destination))
    assert made.returncode == 0, made.stderr
    assert made.stdout == f"Made: {destination}, 12 training and 4 test images in 3 classes.\n"
    assert sorted(os.listdir(destination / "train" / "bird")) == [
        "0000.png",
        "0001.png",
        "0002.png",
        "0003.png",
        "0004.png",
    ]
    # NNNN is the image's index within its class in the release's order, its pixels exact.
    for label, name in enumerate(names):
        for index, image in enumerate(images[labels == label]):
            np.testing.assert_array_equal(
                np.asarray(Image.open(destination / "train" / name / f"{index:04d}.png")), image
            )
    np.testing.assert_array_equal(
        np.asarray(Image.open(destination / "test" / "automobile" / "0001.png")), test_images[2]
    )
    assert sorted(os.listdir(tmp_path)) == [
        "cifar-10-batches-py",
        "cifar-10-python.tar.gz",
        "cifar10-png",
    ]


def test_a_release_whose_pickles_name_anything_else_is_refused_unrun(tmp_path):
    """The batches are pickles: one that would call a function (here os.system) is an error
    that names the file, and the function never runs."""
    release_archive(
        tmp_path / "release.tar.gz",
        np.zeros((5, 32, 32, 3), np.uint8),
        [0] * 5,
        np.zeros((1, 32, 32, 3), np.uint8),
        [0],
        ["cat"],
    )
    canary = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {canary}",)

    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "wb") as file:
        pickle.dump({b"data": Payload()}, file, protocol=2)
    with tarfile.open(tmp_path / "hostile.tar.gz", "w:gz") as archive:
        archive.add(tmp_path / "cifar-10-batches-py", "cifar-10-batches-py")
    with pytest.raises(ValueError, match="test_batch is not a CIFAR batch: a CIFAR batch names no posix.system"):
        cifar10_folder.extract(str(tmp_path / "hostile.tar.gz"), str(tmp_path / "out"))
    assert not canary.exists() and not (tmp_path / "out").exists() and not (tmp_path / "out.done").exists()


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda tmp_path: str(tmp_path / "missing.tar.xz"),
            "No archive at {tmp}/missing.tar.xz: an archive of an image "
            "folder (DIR/train/<class>/<image> and DIR/test/<class>/<image>, one folder per class) or CIFAR-10's "
            "cifar-10-python.tar.gz or CIFAR-100's cifar-100-python.tar.gz is expected.",
        ),
        (
            lambda tmp_path: (tmp_path / "notes.txt").write_text("not an archive") and str(tmp_path / "notes.txt"),
            "{tmp}/notes.txt cannot be extracted: it is neither a tar nor a zip archive.",
        ),
        (
            lambda tmp_path: archive_of(sample_folder(tmp_path / "source") / "train", tmp_path / "train-only.zip"),
            "{tmp}/train-only.zip holds no image folder (DIR/train/<class>/<image> and DIR/test/<class>/<image>, one "
            "folder per class) and no CIFAR release (cifar-10-batches-py/ or cifar-100-python/) at its top or in its "
            "one top folder.",
        ),
    ],
    ids=["missing", "not an archive", "no train and test"],
)
def test_data_refuses_what_is_not_an_archive_of_an_image_folder(tmp_path, make, message):
    result = run("data", make(tmp_path), "--data-dir", str(tmp_path / "cifar10-png"))
    assert result.returncode == 2
    assert result.stderr.startswith("error: " + message.format(tmp=tmp_path))
    assert not (tmp_path / "cifar10-png").exists() and not (tmp_path / "cifar10-png.done").exists()
    assert [name for name in os.listdir(tmp_path) if name.startswith(cifar10_folder.SCRATCH_PREFIX)] == []


@pytest.mark.parametrize(
    "members, archive, name",
    [
        (["cifar-10-batches-py/", "cifar-10-batches-py/data_batch_1"], "cifar-10-python.tar.gz", "cifar10-png"),
        (["cifar-100-python/", "cifar-100-python/train"], "cifar-100-python.tar.gz", "cifar100-png"),
        (["cifar100-png/", "cifar100-png/train/apple/0000.png"], "cifar100-png.tar.xz", "cifar100-png"),
        (["./", "./train/cat/0.png"], "my-images.tar.xz", "my-images"),
        (["train/", "train/cat/0.png"], "pets.zip", "pets"),
        (["../escape/", "../escape/train/cat/0.png"], "hostile.tar", "hostile"),
        ([".hidden/", ".hidden/train/cat/0.png"], "hidden.tar", "hidden"),
        (["README"], "notes.tar", "notes"),
    ],
    ids=["cifar-10 release", "cifar-100 release", "png archive", "dot top", "zip at top", "parent", "hidden", "file"],
)
def test_data_names_the_folder_by_what_the_archive_holds(tmp_path, members, archive, name):
    """`data`'s default folder: a release's image folder, the archive's top folder, or the
    archive's name for an image folder at its top (and for a top name that would leave the cache
    or hide in it), from the first member alone."""
    path = tmp_path / archive
    if archive.endswith(".zip"):
        with zipfile.ZipFile(path, "w") as opened:
            for member in members:
                opened.writestr(member, b"" if member.endswith("/") else b"x")
    else:
        with tarfile.open(
            path, "w:gz" if archive.endswith("gz") else "w:xz" if archive.endswith("xz") else "w"
        ) as opened:
            for member in members:
                info = tarfile.TarInfo(member.rstrip("/") or ".")
                info.type = tarfile.DIRTYPE if member.endswith("/") else tarfile.REGTYPE
                info.size = 0 if member.endswith("/") else 1
                opened.addfile(info, io.BytesIO(b"x") if info.size else None)
    assert cifar10_folder.folder_name(str(path)) == name


def test_data_reads_the_archive_it_is_given_even_where_the_default_folder_is_made(tmp_path):
    """Into a cache where cifar10-png is made, a file that is no archive is refused in one line
    (it is never answered "Already made"), and another archive lands in a folder of its own name."""
    cache = tmp_path / "cache"
    environment = dict(os.environ, XDG_CACHE_HOME=str(cache))
    images = archive_of(sample_folder(tmp_path / "source"), tmp_path / "cifar10-png.tar.xz", "cifar10-png")
    for expected in ("Made", "Already made"):
        made = subprocess.run([KERAS_PREACT, "data", images], cwd=ROOT, capture_output=True, text=True, env=environment)
        assert made.stdout.startswith(f"{expected}: {cache}/keras-preact/cifar10-png, 10 training"), made.stderr
    notes = tmp_path / "README.md"
    notes.write_text("# not an archive\n")
    refused = subprocess.run(
        [KERAS_PREACT, "data", str(notes)], cwd=ROOT, capture_output=True, text=True, env=environment
    )
    assert (refused.returncode, refused.stdout) == (2, "")
    assert (
        refused.stderr
        == f"error: {notes} cannot be extracted: it is neither a tar nor a zip archive. Received: {str(notes)!r}\n"
    )
    jpegs = archive_of(sample_folder(tmp_path / "jpegs"), tmp_path / "cifar10-jpeg.zip", "cifar10-jpeg")
    other = subprocess.run([KERAS_PREACT, "data", jpegs], cwd=ROOT, capture_output=True, text=True, env=environment)
    assert other.stdout.startswith(f"Made: {cache}/keras-preact/cifar10-jpeg, 10 training"), other.stderr


def tar_with(path, member, content=b"", mode="w"):
    """A tar archive of the ten docs JPEGs' image folder with `member` (a TarInfo) added."""
    with tarfile.open(path, mode) as archive:
        archive.add(sample_folder(path.parent / f"{path.name}-source"), "cifar10")
        archive.addfile(member, io.BytesIO(content))
    return path


def member(name, kind=tarfile.REGTYPE, size=0, **fields):
    info = tarfile.TarInfo(name)
    info.type, info.size = kind, size
    for field, value in fields.items():
        setattr(info, field, value)
    return info


def truncated(path, keep):
    """`path` cut to its first `keep` bytes (a callable of its size)."""
    path = pathlib.Path(path)
    data = path.read_bytes()
    path.write_bytes(data[: keep(len(data))])
    return path


def tar_cut_between_members(path):
    """An uncompressed tar whose end-of-archive mark and last members are cut off, at a member's start."""
    tar_with(path, member("cifar10/train/cat/extra.jpg", size=600), bytes(600))
    with tarfile.open(path) as archive:
        last = archive.getmembers()[-1]
    return truncated(path, lambda size: last.offset)


def zip_with_a_damaged_member(path):
    archive_of(sample_folder(path.parent / "zip-source"), path)
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as opened:
        first = opened.infolist()[0]
    start = first.header_offset + 30 + len(first.filename.encode()) + 40  # inside its compressed data
    data[start : start + 8] = bytes(8)
    path.write_bytes(bytes(data))
    return path


def zip_with(path, name, attributes=0, content=b"x"):
    archive_of(sample_folder(path.parent / "zip-source"), path)
    with zipfile.ZipFile(path, "a") as opened:
        info = zipfile.ZipInfo(name)
        info.external_attr = attributes << 16
        opened.writestr(info, content)
    return path


HOSTILE = {
    "a member outside the folder": (
        lambda tmp: tar_with(tmp / "a.tar", member("../outside.txt", size=3), b"bad"),
        "which is outside the destination",
    ),
    "a symbolic link": (
        lambda tmp: tar_with(tmp / "a.tar", member("cifar10/link", tarfile.SYMTYPE, linkname="/etc/passwd")),
        "its member 'cifar10/link' is a link or a device, not a file or a folder",
    ),
    "a device": (
        lambda tmp: tar_with(tmp / "a.tar", member("cifar10/device", tarfile.CHRTYPE, devmajor=1, devminor=3)),
        "its member 'cifar10/device' is a link or a device, not a file or a folder",
    ),
    "a truncated tar.xz": (
        lambda tmp: truncated(archive_of(sample_folder(tmp / "source"), tmp / "a.tar.xz"), lambda size: size // 2),
        "Compressed file ended before the end-of-stream marker was reached",
    ),
    "a tar cut between members": (
        lambda tmp: tar_cut_between_members(tmp / "a.tar"),
        "it ends before its end-of-archive mark (truncated)",
    ),
    "a damaged zip member": (lambda tmp: zip_with_a_damaged_member(tmp / "a.zip"), "Bad CRC-32 for file"),
    "a zip member outside the folder": (
        lambda tmp: zip_with(tmp / "a.zip", "../outside.txt"),
        "its member '../outside.txt' names a path outside its folder",
    ),
    "a zip symbolic link": (
        lambda tmp: zip_with(tmp / "a.zip", "cifar10/link", stat.S_IFLNK | 0o777, b"/etc/passwd"),
        "its member 'cifar10/link' is a link or a device, not a file or a folder",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_or_damaged_archive_is_one_line_and_leaves_nothing(tmp_path, case):
    make, reason = HOSTILE[case]
    archive = make(tmp_path)
    destination = tmp_path / "out" / "cifar10-png"
    result = run("data", str(archive), "--data-dir", str(destination))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"error: {archive} cannot be extracted: ") and reason in result.stderr
    assert result.stderr.endswith(f"Received: {str(archive)!r}\n") and result.stderr.count("\n") == 1
    assert os.listdir(tmp_path / "out") == []  # no folder, no mark, no scratch, no lock
    assert not (tmp_path / "outside.txt").exists() and not (tmp_path / "out" / "outside.txt").exists()


def test_extraction_is_bounded_in_bytes_and_files(tmp_path, monkeypatch):
    """A zip that would extract more than the bound (a bomb: 4 MB of zeros in a few KB) is
    refused before a byte is written; so is one of too many files."""
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as opened:
        opened.writestr("cifar10/train/cat/zeros.jpg", bytes(4 * 2**20))
    assert bomb.stat().st_size < 10_000
    monkeypatch.setattr(cifar10_folder, "MAXIMUM_BYTES", 2**20)
    with pytest.raises(ValueError, match=r"it holds more than 1,000,000 files or 0.000976562 GiB"):
        cifar10_folder.extract(str(bomb), str(tmp_path / "out"))
    many = archive_of(sample_folder(tmp_path / "source"), tmp_path / "many.tar.xz")
    monkeypatch.setattr(cifar10_folder, "MAXIMUM_FILES", 5)
    with pytest.raises(ValueError, match=r"it holds more than 5 files or 0.000976562 GiB \(at '.*'\)"):
        cifar10_folder.extract(many, str(tmp_path / "out"))
    assert sorted(os.listdir(tmp_path)) == ["bomb.zip", "many.tar.xz", "source"]
    # Checked before the first member is written, not as the members are.
    (tmp_path / "scratch").mkdir()
    with pytest.raises(ValueError, match=r"more than 5 files"):
        cifar10_folder.unpack(many, str(tmp_path / "scratch"))
    assert os.listdir(tmp_path / "scratch") == []


@pytest.mark.parametrize(
    "arguments",
    [
        ["evaluate", "--model", "resnet20"],
        ["train", "--config", "cifar10_zoo", "--set", "dataset=folder"],
    ],
    ids=["evaluate", "train"],
)
def test_commands_refuse_a_missing_image_folder_before_loading_tensorflow(tmp_path, arguments):
    """In a process where TensorFlow cannot be imported, the folder's error comes first: it is
    checked before anything loads (0.1 s against 4-29 s)."""
    hidden = os.path.join(ROOT, "tests", "without_tensorflow")
    result = subprocess.run(
        [KERAS_PREACT, *arguments, "--data-dir", str(tmp_path / "nowhere")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": hidden, "KERAS_BACKEND": "tensorflow"},
    )
    assert result.returncode == 2
    assert result.stderr == (
        "error: dataset=folder needs --data-dir to be an image folder (DIR/train/<class>/<image> and "
        "DIR/test/<class>/<image>, one folder per class; `keras-preact data ARCHIVE` makes "
        f"{cifar10_folder.CIFAR10_FOLDER} from an archive of one or from cifar-10-python.tar.gz, and the cifar100-png "
        "folder beside it from CIFAR-100's, docs/training.md#data). "
        f"Received: data_dir={str(tmp_path / 'nowhere')!r}\n"
    )


def test_evaluate_calls_a_missing_weights_file_missing_before_loading_tensorflow(tmp_path):
    hidden = os.path.join(ROOT, "tests", "without_tensorflow")
    missing = str(tmp_path / "resnet20.weights.h5")
    result = subprocess.run(
        [KERAS_PREACT, "evaluate", "--model", "resnet20", "--weights", missing],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": hidden, "KERAS_BACKEND": "tensorflow"},
    )
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"error: The weights file {missing} is missing: give the path of a .weights.h5 file saved from resnet20, or "
        f"cifar10 or cifar100 for the shipped weights. Received: --weights {missing!r}\n"
    )


def test_the_data_sets_with_folders_are_those_with_shipped_weights():
    from keras_preact import pretrained

    assert list(cifar10_folder.FOLDERS) == list(pretrained.DATASETS)


def test_another_networks_weights_file_is_one_line(tmp_path):
    import keras_preact

    keras_preact.ResNet20().save_weights(tmp_path / "resnet20.weights.h5")
    result = run(
        "evaluate",
        "--model",
        "resnet56",
        "--weights",
        str(tmp_path / "resnet20.weights.h5"),
        "--data-dir",
        str(sample_folder(tmp_path / "images")),
    )
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"error: Could not load the weights file {tmp_path / 'resnet20.weights.h5'} into resnet56: a file saved from "
        "another network, or a truncated or corrupt one (ValueError: A total of 95 objects could not be loaded). "
        "Give the weights of this very network.\n"
    )


def test_a_fifo_named_like_an_image_is_refused_in_one_line_never_read(tmp_path):
    """Opened, a FIFO waits for a writer: `evaluate` and the calibration images refuse it by name."""
    from keras_preact_training.export import calibration

    root = sample_folder(tmp_path / "images")
    fifo = root / "test" / "cat" / "waiting.png"
    os.mkfifo(fifo)
    result = run("evaluate", "--model", "resnet20", "--data-dir", str(root))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"error: {fifo} is named like an image but is not a regular file (a FIFO, a socket, a device or a folder): "
        f"move it out of the folder. Received: {str(fifo)!r}\n"
    )
    with pytest.raises(ValueError, match="waiting.png is named like an image but is not a regular file"):
        calibration.image_files([str(root)])


def test_data_stopped_by_sigterm_or_kill_leaves_nothing_the_next_run_does_not_clean(tmp_path):
    """SIGTERM while `data` extracts: one line, exit 130, no scratch folder left; a scratch folder
    of a killed run is removed by the next, which makes the folder with mkdir's mode."""
    from PIL import Image

    source = sample_folder(tmp_path / "source")
    rng = np.random.default_rng(0)
    for index in range(3000):  # enough images that the extraction is under way when the signal comes
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(
            source / "train" / "cat" / f"{index}.png"
        )
    archive = archive_of(source, tmp_path / "many.tar.xz")
    out = tmp_path / "out"
    out.mkdir()
    process = subprocess.Popen(
        [KERAS_PREACT, "data", archive, "--data-dir", str(out / "images")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not any(name.startswith(cifar10_folder.SCRATCH_PREFIX) for name in os.listdir(out)):
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    _, errors = process.communicate(timeout=120)
    assert (process.returncode, errors) == (130, "\nInterrupted (Ctrl-C).\n")
    assert os.listdir(out) == []
    stale = out / f"{cifar10_folder.SCRATCH_PREFIX}killed"
    (stale / "train").mkdir(parents=True)
    previous = os.umask(0o027)
    try:
        assert cifar10_folder.extract(archive, str(out / "images")) == str(out / "images")
    finally:
        os.umask(previous)
    assert sorted(os.listdir(out)) == ["images"]
    assert stat.S_IMODE(os.stat(out / "images").st_mode) == 0o750


def test_evaluate_refuses_weights_that_do_not_ship_before_reading_the_data(tmp_path):
    root = sample_folder(tmp_path / "images")
    (root / "test" / "cat" / "cat_0000.jpg").write_bytes(b"not an image: an error, were the data read first")
    result = run("evaluate", "--model", "resnet1202", "--data-dir", str(root))  # the paper's overfit example
    assert result.returncode == 2
    assert result.stderr.startswith("error: keras-preact ships cifar10 weights for these networks only")
    assert "Received: model='resnet1202'" in result.stderr


@pytest.mark.tensorflow
def test_offline_a_data_set_to_download_fails_at_once_with_the_route_to_local_data(tmp_path, monkeypatch):
    from keras_preact_training.data import input_tensorflow
    from keras_preact_training.train import named_configs

    # A name that never resolves (RFC 2606), as every name does offline.
    monkeypatch.setitem(input_tensorflow.DOWNLOAD_HOSTS, "cifar10", "download.invalid")
    config = named_configs.CONFIGS["cifar10_paper"].override(f"data_dir={tmp_path}")
    with pytest.raises(FileNotFoundError) as error:
        input_tensorflow.tfds_dataset(config)
    assert str(error.value).startswith(f"'cifar10' is not prepared in {tmp_path}/cifar10/")
    assert "its download server download.invalid cannot be reached" in str(error.value)
    assert "or train with --set dataset=folder on an image folder (DIR/train/<class>/<image>" in str(error.value)


def test_the_errors_send_users_to_a_place_that_exists():
    assert "docs/training.md#data" in cifar10_folder.ROUTE
    with open(os.path.join(ROOT, "docs", "training.md")) as file:
        assert "\n{: #data }\n" in file.read()
