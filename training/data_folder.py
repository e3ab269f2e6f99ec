"""The CIFAR-10 image folder that the docs' commands, the tests and the zoo's queue read, and
`keras-preact data`, which makes it from an archive.

An image folder is `DIR/train/<class>/<image>` and `DIR/test/<class>/<image>`: one folder
per class in each split, the layout of `keras.utils.image_dataset_from_directory` and
`tfds.folder_dataset.ImageFolder`, which `--set dataset=folder --data-dir DIR` trains and
evaluates on. The zoo's networks were trained on CIFAR-10 as JPEGs of quality 75 in this
layout (60,000 images: 18.6 MB as a tar.xz archive, 237 MB extracted), kept in
`CIFAR10_FOLDER`.
"""

import contextlib
import fcntl
import os
import shutil
import tarfile
import tempfile
import zipfile

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "keras-preact")
CIFAR10_FOLDER = os.path.join(CACHE, "cifar10-jpeg")
LAYOUT = "DIR/train/<class>/<image> and DIR/test/<class>/<image>, one folder per class"
ROUTE = (
    f"an image folder ({LAYOUT}; `keras-preact data ARCHIVE` makes {CIFAR10_FOLDER} from an archive of one, "
    "docs/training.md#data)"
)


def check_folder(folder):
    """Raises FileNotFoundError, saying the layout and how to make one, unless `folder` holds
    train/ and test/ folders (their classes and images are checked as they are read)."""
    if folder is None or not all(os.path.isdir(os.path.join(folder, split)) for split in ("train", "test")):
        raise FileNotFoundError(f"dataset=folder needs --data-dir to be {ROUTE}. Received: data_dir={folder!r}")


def or_default(data_dir):
    """`data_dir`, or where it is `None`, `CIFAR10_FOLDER`."""
    return CIFAR10_FOLDER if data_dir is None else data_dir


def counts(folder):
    """{split: (images, classes)} of an image folder, from its listing alone."""
    result = {}
    for split in ("train", "test"):
        classes = [entry.path for entry in os.scandir(os.path.join(folder, split)) if entry.is_dir()]
        images = sum(name.lower().endswith(IMAGE_EXTENSIONS) for path in classes for name in os.listdir(path))
        result[split] = (images, len(classes))
    return result


def extract(archive, destination=CIFAR10_FOLDER):
    """Makes the image folder `destination` from `archive` (a .tar, .tar.gz, .tar.xz, ... or
    .zip holding train/ and test/, at its top or in its one top folder), once: a destination
    marked done (`<destination>.done`) is left as it is. Processes that extract at the same
    time take turns (`<destination>.lock`); the files go to a temporary folder beside the
    destination, renamed into place when complete, so that nothing half-written is ever
    read as the data.

    Returns:
        `destination`, as an absolute path.

    Raises:
        FileNotFoundError: for an archive that does not exist.
        ValueError: for a file that is not such an archive, or an archive without the layout.
    """
    if not os.path.isfile(archive):
        raise FileNotFoundError(
            f"No archive at {archive}: an archive of an image folder ({LAYOUT}) is expected. Received: {archive!r}"
        )
    destination = os.path.abspath(os.path.expanduser(destination))
    os.makedirs(os.path.dirname(destination), exist_ok=True)
    with open(destination + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_made(destination):
            return destination
        with tempfile.TemporaryDirectory(dir=os.path.dirname(destination), prefix=".extracting-") as scratch:
            unpack(archive, scratch)
            root = folder_within(scratch, archive)
            if os.path.exists(destination):
                shutil.rmtree(destination)  # an extraction that stopped before it was marked done
            os.rename(root, destination)
        with open(destination + ".done", "w"):
            pass
    return destination


def is_made(destination):
    """Whether `extract` made the folder `destination` to the end (its `.done` mark)."""
    destination = os.path.abspath(os.path.expanduser(destination))
    return os.path.isdir(destination) and os.path.exists(destination + ".done")


def unpack(archive, folder):
    """The files of a tar or zip archive into `folder`, none outside it."""
    if tarfile.is_tarfile(archive):
        with tarfile.open(archive) as opened:
            opened.extractall(folder, filter="data")
    elif zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as opened:
            opened.extractall(folder)  # zipfile keeps every member inside `folder`
    else:
        raise ValueError(f"{archive} is neither a tar nor a zip archive. Received: {archive!r}")


def folder_within(scratch, archive):
    """The extracted image folder: `scratch` itself, or its one top folder."""
    entries = [entry.path for entry in os.scandir(scratch) if entry.is_dir()]
    for candidate in [scratch] + (entries if len(entries) == 1 else []):
        with contextlib.suppress(FileNotFoundError):
            check_folder(candidate)
            return candidate
    raise ValueError(
        f"{archive} holds no image folder ({LAYOUT}) at its top or in its one top folder. Received: {archive!r}"
    )
