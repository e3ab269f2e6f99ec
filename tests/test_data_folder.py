"""The CIFAR-10 image folder's one place and `keras-preact data`, which makes it from an archive;
commands that read an image folder refuse a missing or misshapen one at once, saying how a
folder is laid out and made; offline, a data set that would be downloaded fails at once."""

import io
import os
import pathlib
import pickle
import shutil
import stat
import subprocess
import tarfile
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
    assert sorted(os.listdir(tmp_path / "cache")) == ["cifar10-png", "cifar10-png.done", "cifar10-png.lock"]
    again = run("data", archive, "--data-dir", destination)
    assert again.stdout.startswith(f"Already made: {destination}, 10 training")


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
        f"error: {destination} exists and was not made by `keras-preact data` (no {destination}.done): its files "
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
        "cifar10-png.done",
        "cifar10-png.lock",
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
    with pytest.raises(ValueError, match="test_batch is not a CIFAR-10 batch: a CIFAR-10 batch names no posix.system"):
        cifar10_folder.extract(str(tmp_path / "hostile.tar.gz"), str(tmp_path / "out"))
    assert not canary.exists() and not (tmp_path / "out").exists() and not (tmp_path / "out.done").exists()


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda tmp_path: str(tmp_path / "missing.tar.xz"),
            "No archive at {tmp}/missing.tar.xz: an archive of an image "
            "folder (DIR/train/<class>/<image> and DIR/test/<class>/<image>, one folder per class) or CIFAR-10's "
            "cifar-10-python.tar.gz is expected.",
        ),
        (
            lambda tmp_path: (tmp_path / "notes.txt").write_text("not an archive") and str(tmp_path / "notes.txt"),
            "{tmp}/notes.txt cannot be extracted: it is neither a tar nor a zip archive.",
        ),
        (
            lambda tmp_path: archive_of(sample_folder(tmp_path / "source") / "train", tmp_path / "train-only.zip"),
            "{tmp}/train-only.zip holds no image folder (DIR/train/<class>/<image> and DIR/test/<class>/<image>, one "
            "folder per class) and no CIFAR-10 release (cifar-10-batches-py/) at its top or in its one top folder.",
        ),
    ],
    ids=["missing", "not an archive", "no train and test"],
)
def test_data_refuses_what_is_not_an_archive_of_an_image_folder(tmp_path, make, message):
    result = run("data", make(tmp_path), "--data-dir", str(tmp_path / "cifar10-png"))
    assert result.returncode == 2
    assert result.stderr.startswith("error: " + message.format(tmp=tmp_path))
    assert not (tmp_path / "cifar10-png").exists() and not (tmp_path / "cifar10-png.done").exists()
    assert [name for name in os.listdir(tmp_path) if name.startswith(".extracting")] == []


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
    assert os.listdir(tmp_path / "out") == ["cifar10-png.lock"]  # no folder, no mark, no scratch
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
    assert sorted(os.listdir(tmp_path)) == ["bomb.zip", "many.tar.xz", "out.lock", "source"]


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
        f"{cifar10_folder.CIFAR10_FOLDER} from an archive of one or from cifar-10-python.tar.gz, docs/training.md#data). "
        f"Received: data_dir={str(tmp_path / 'nowhere')!r}\n"
    )


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
