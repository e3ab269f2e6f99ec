"""The CIFAR-10 and CIFAR-100 image folders that the docs' commands, the tests and the zoo's
queue read, and `keras-preact data`, which makes them from an archive.

An image folder is `DIR/train/<class>/<image>` and `DIR/test/<class>/<image>`: one folder
per class in each split, the layout of `keras.utils.image_dataset_from_directory` and
`tfds.folder_dataset.ImageFolder`, which `--set dataset=folder --data-dir DIR` trains and
evaluates on. The zoo's networks are trained and measured on CIFAR-10 with its original
pixels in this layout, as PNG files (60,000 images: `cifar10-png.tar.xz`, 137 MB, or made
from CIFAR-10's own release for Python, `cifar-10-python.tar.gz`, by `cifar_release`), kept
in `CIFAR10_FOLDER`; CIFAR-100's likewise (`cifar100-png.tar.xz` or `cifar-100-python.tar.gz`)
in `CIFAR100_FOLDER`. `keras-preact data` names the folder it makes by what the archive holds
(`folder_name`).
"""

import contextlib
import fcntl
import lzma
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib

from . import cifar_release
from .images import IMAGE_SUFFIXES

CACHE = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "keras-preact")
CIFAR10_FOLDER = os.path.join(CACHE, "cifar10-png")
CIFAR100_FOLDER = os.path.join(CACHE, "cifar100-png")
# Where `evaluate` reads each data set of shipped weights by default.
FOLDERS = {"cifar10": CIFAR10_FOLDER, "cifar100": CIFAR100_FOLDER}
# The suffixes an archive's name may end with, dropped to name the folder of an archive
# whose image folder is at its top.
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar.bz2", ".tbz2", ".tar", ".zip")
# The prefix of the scratch folder an extraction writes beside its destination: a folder of this
# name that no extraction holds (its process killed) is removed by the next.
SCRATCH_PREFIX = ".keras-preact-extracting-"
# The file inside a folder `keras-preact data` made, which says so.
MARK = ".keras-preact-data"
LAYOUT = "DIR/train/<class>/<image> and DIR/test/<class>/<image>, one folder per class"
ROUTE = (
    f"an image folder ({LAYOUT}; `keras-preact data ARCHIVE` makes {CIFAR10_FOLDER} from an archive of one "
    "or from cifar-10-python.tar.gz, and the cifar100-png folder beside it from CIFAR-100's, docs/training.md#data)"
)


def check_folder(folder):
    """Raises FileNotFoundError, saying the layout and how to make one, unless `folder` holds
    train/ and test/ folders (their classes and images are checked as they are read)."""
    if folder is None or not all(os.path.isdir(os.path.join(folder, split)) for split in ("train", "test")):
        raise FileNotFoundError(f"dataset=folder needs --data-dir to be {ROUTE}. Received: data_dir={folder!r}")


def or_default(data_dir, dataset="cifar10"):
    """`data_dir`, or where it is `None`, the folder of `dataset` (a key of `FOLDERS`;
    CIFAR-10's for any other)."""
    return FOLDERS.get(dataset, CIFAR10_FOLDER) if data_dir is None else data_dir


def folder_name(archive):
    """The name of the folder `keras-preact data` makes from `archive`, by what it holds: the
    image folder of a CIFAR release ("cifar10-png", "cifar100-png"), else the archive's top
    folder, or for an image folder at the archive's top, the archive's name without its
    suffix. Read from the archive's first member alone.

    Raises:
        FileNotFoundError: for an archive that does not exist.
        ValueError: for a file that is no tar or zip archive, or an empty one.
    """
    check_archive(archive)
    try:
        if tarfile.is_tarfile(archive):
            with tarfile.open(archive) as opened:
                member = opened.next()
                first, folder = (member.name, member.isdir()) if member is not None else (None, False)
        elif zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as opened:
                first = next(iter(opened.namelist()), None)
                folder = first is not None and first.endswith("/")
        else:
            raise ValueError("it is neither a tar nor a zip archive")
        if first is None:
            raise ValueError("it is empty")
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, lzma.LZMAError, zlib.error, OSError, ValueError) as error:
        raise ValueError(f"{archive} cannot be extracted: {error}. Received: {archive!r}") from None
    parts = [part for part in first.replace("\\", "/").split("/") if part not in ("", ".")]
    releases = {release.folder: release.image_folder for release in cifar_release.RELEASES}
    if parts and parts[0] in releases:
        return releases[parts[0]]
    # A name that leaves the cache (".."), or hides there, is not taken: the archive's own is.
    if parts and parts[0] not in ("train", "test") and not parts[0].startswith(".") and (len(parts) > 1 or folder):
        return parts[0]
    name = os.path.basename(archive)
    suffix = next((suffix for suffix in ARCHIVE_SUFFIXES if name.lower().endswith(suffix)), "")
    return name[: len(name) - len(suffix)] or name


def check_archive(archive):
    """Raises FileNotFoundError, saying what is expected, unless `archive` is a file."""
    if not os.path.isfile(archive):
        raise FileNotFoundError(
            f"No archive at {archive}: an archive of an image folder ({LAYOUT}) or CIFAR-10's "
            f"cifar-10-python.tar.gz or CIFAR-100's cifar-100-python.tar.gz is expected. Received: {archive!r}"
        )


def counts(folder):
    """{split: (images, classes)} of an image folder, from its listing alone."""
    result = {}
    for split in ("train", "test"):
        classes = [entry.path for entry in os.scandir(os.path.join(folder, split)) if entry.is_dir()]
        images = sum(name.lower().endswith(IMAGE_SUFFIXES) for path in classes for name in os.listdir(path))
        result[split] = (images, len(classes))
    return result


def extract(archive, destination=CIFAR10_FOLDER):
    """Makes the image folder `destination` from `archive`, once: a .tar, .tar.gz, .tar.xz, ...
    or .zip holding train/ and test/ (at its top or in its one top folder), or CIFAR-10's or
    CIFAR-100's release for Python (`cifar-10-python.tar.gz`, `cifar-100-python.tar.gz`), whose
    batches become PNG files (`cifar_release`). A destination that holds the mark `MARK` is
    left as it is; a destination that exists without it is not this function's and is never
    touched: an error, unless it is an empty folder. Nothing is ever written beside the
    destination under a name of its own: the mark is inside the folder, written before the
    folder is renamed into place, so that it arrives with the data. Processes that extract at the same
    time take turns (a lock on the folder that holds the destination, no file of its own); the
    files go to a temporary folder beside the
    destination, renamed into place when complete, so that nothing half-written is ever
    read as the data.

    Returns:
        `destination`, as an absolute path.

    Raises:
        FileNotFoundError: for an archive that does not exist.
        FileExistsError: for a destination that exists, holds files and was not made here.
        ValueError: for a file that is not such an archive, or an archive without the layout.
    """
    check_archive(archive)
    destination = os.path.abspath(os.path.expanduser(destination))
    os.makedirs(os.path.dirname(destination), exist_ok=True)
    lock = os.open(os.path.dirname(destination), os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_made(destination):
            return destination
        refuse_foreign(destination)
        remove_stale_scratch(os.path.dirname(destination))
        with tempfile.TemporaryDirectory(dir=os.path.dirname(destination), prefix=SCRATCH_PREFIX) as scratch:
            unpack(archive, scratch)
            root = folder_within(scratch, archive)
            with open(os.path.join(root, MARK), "x") as mark:
                mark.write(f"Made by `keras-preact data` from {os.path.basename(archive)}.\n")
            if os.path.isdir(destination):
                os.rmdir(destination)  # empty (`refuse_foreign`)
            os.rename(root, destination)
            # The scratch folder was private (0700); the data gets what mkdir would give it.
            os.chmod(destination, 0o777 & ~current_umask())
    finally:
        os.close(lock)  # and the lock with it
    return destination


def remove_stale_scratch(folder):
    """Removes the scratch folders (`SCRATCH_PREFIX`) in `folder` that extractions killed before
    their end left behind; called under the lock, when no extraction there holds one."""
    for entry in os.scandir(folder):
        if entry.name.startswith(SCRATCH_PREFIX) and entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)


def current_umask():
    """The process's umask (read by setting it, then put back)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def refuse_foreign(destination):
    """Raises FileExistsError for a `destination` that exists and is not an empty folder: the
    user's own files, which `extract` must never remove or mix with the data."""
    if not os.path.lexists(destination) or (os.path.isdir(destination) and not os.listdir(destination)):
        return
    raise FileExistsError(
        f"{destination} exists and was not made by `keras-preact data` (no {MARK} in it): its files are "
        f"left as they are. Pass another --data-dir, or move it away first. Received: data_dir={destination!r}"
    )


def is_made(destination):
    """Whether `extract` made the folder `destination` to the end: its mark inside, or the
    `<destination>.done` beside it that versions before 2026-12-07 wrote (read, never written)."""
    destination = os.path.abspath(os.path.expanduser(destination))
    return os.path.isfile(os.path.join(destination, MARK)) or (
        os.path.isdir(destination) and os.path.isfile(destination + ".done")
    )


def unpack(archive, folder):
    """The files of a tar or zip archive into `folder`, none outside it: regular files and
    folders only, at most `MAXIMUM_FILES` and `MAXIMUM_BYTES` in all, read to the archive's end.
    Every member is checked before the first is written: a tar's headers are read in a pass of
    their own (for a compressed tar, a second decompression: 26 s of CIFAR-10's 137 MB .tar.xz
    on this project's 2-core EPYC), a zip's from its central directory.

    Raises:
        ValueError: in one line, for a file that is no tar or zip archive, a member that is a
            link, a device or a path outside `folder`, an archive past the bounds, or one that is
            truncated or damaged.
    """
    bound = Bound(archive)
    try:
        if tarfile.is_tarfile(archive):
            with tarfile.open(archive) as opened:
                for member in opened:
                    bound.tar_member(member, folder)
            with tarfile.open(archive) as opened:
                opened.extractall(folder, filter=bound.checked_tar_member)
                # The end-of-archive mark (two zero blocks): a tar cut between members has none.
                opened.fileobj.seek(opened.offset)
                if opened.fileobj.read(2 * tarfile.BLOCKSIZE) != bytes(2 * tarfile.BLOCKSIZE):
                    raise ValueError("it ends before its end-of-archive mark (truncated)")
        elif zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as opened:
                for member in opened.infolist():
                    bound.zip_member(member)
                opened.extractall(folder)
        else:
            raise ValueError("it is neither a tar nor a zip archive")
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, lzma.LZMAError, zlib.error, OSError, ValueError) as error:
        raise ValueError(f"{archive} cannot be extracted: {error}. Received: {archive!r}") from None


# The most an archive may extract, from the data sets' shape: CIFAR-10 and CIFAR-100 as PNG
# folders hold 60,000 images of 32 x 32 x 3 in 146 MB (2.4 KB an image); a million images of up
# to 4 KiB each, 4 GiB: 16 times either data set in files, 29 times in bytes. A larger folder is
# extracted by other means and given to --data-dir.
MAXIMUM_FILES = 1_000_000
MAXIMUM_BYTES = 4 * 2**30


class Bound:
    """The checks of each member of an archive as it is extracted, and the running totals."""

    def __init__(self, archive):
        self.archive, self.files, self.bytes = archive, 0, 0

    def count(self, name, size):
        self.files += 1
        self.bytes += size
        if self.files > MAXIMUM_FILES or self.bytes > MAXIMUM_BYTES:
            raise ValueError(
                f"it holds more than {MAXIMUM_FILES:,} files or {MAXIMUM_BYTES / 2**30:g} GiB (at {name!r}), "
                f"more than `keras-preact data` extracts"
            )

    def tar_member(self, member, path):
        """tarfile's extraction filter: Python's "data" filter (no path outside `path`, no
        absolute path), then regular files and folders only, counted."""
        if not (member.isfile() or member.isdir()):
            raise ValueError(f"its member {member.name!r} is a link or a device, not a file or a folder")
        member = tarfile.data_filter(member, path)
        self.count(member.name, member.size)
        return member

    def checked_tar_member(self, member, path):
        """`tar_member` again as the files are written, uncounted: the archive read a second time
        is checked as it is read, whatever changed since the first."""
        if not (member.isfile() or member.isdir()):
            raise ValueError(f"its member {member.name!r} is a link or a device, not a file or a folder")
        return tarfile.data_filter(member, path)

    def zip_member(self, member):
        """A zip member: a relative path inside the archive's folder, a file or a folder, counted
        at its declared size (zipfile reads no more than that)."""
        parts = member.filename.replace("\\", "/").split("/")
        if member.filename.startswith("/") or ".." in parts:
            raise ValueError(f"its member {member.filename!r} names a path outside its folder")
        kind = stat.S_IFMT(member.external_attr >> 16)
        if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise ValueError(f"its member {member.filename!r} is a link or a device, not a file or a folder")
        self.count(member.filename, member.file_size)


def folder_within(scratch, archive):
    """The extracted image folder: `scratch` itself or its one top folder, or the image folder
    written from the CIFAR release found at either (`cifar_release`)."""
    entries = [entry.path for entry in os.scandir(scratch) if entry.is_dir()]
    for candidate in [scratch] + (entries if len(entries) == 1 else []):
        release = cifar_release.release_in(candidate)
        if release is not None:
            return cifar_release.write_image_folder(candidate, release, os.path.join(scratch, ".images"))
        with contextlib.suppress(FileNotFoundError):
            check_folder(candidate)
            return candidate
    raise ValueError(
        f"{archive} holds no image folder ({LAYOUT}) and no CIFAR release (cifar-10-batches-py/ or "
        f"cifar-100-python/) at its top or in its one top folder. Received: {archive!r}"
    )
