"""`keras-preact data`: the CIFAR-10 or CIFAR-100 image folder that `evaluate` and the docs'
commands read, made from the data set's release for Python or from an archive of an image folder."""

import os
import signal

from ..data import cifar10_folder

HELP = "make the CIFAR-10 or CIFAR-100 image folder that evaluate and the docs' commands read, from an archive"
DESCRIPTION = (
    "Make the image folder (train/<class>/<image> and test/<class>/<image>) that `keras-preact evaluate` "
    f"reads by default, in {cifar10_folder.CACHE} under the name of what the archive holds (cifar10-png, "
    "cifar100-png, or the archive's own folder), or in --data-dir: from CIFAR-10's or CIFAR-100's release for "
    "Python (cifar-10-python.tar.gz, cifar-100-python.tar.gz, as keras.datasets downloads them: their images "
    "become PNG files, the zoo's data; CIFAR-100's with its 100 fine labels), from cifar10-png.tar.xz or "
    "cifar100-png.tar.xz, or from any archive of an image folder; once: a folder already made is left as it "
    "is, and a folder that it did not make is never touched. An archive of links, devices or paths outside its "
    f"folder, or of more than {cifar10_folder.MAXIMUM_FILES:,} files or "
    f"{cifar10_folder.MAXIMUM_BYTES / 2**30:g} GiB (16 times CIFAR-10's 60,000 images, 29 times its 146 MB), "
    "is refused before anything is written."
)
TENSORFLOW = "never"
BACKENDS = None


def add_arguments(parser):
    parser.add_argument(
        "archive",
        help="cifar-10-python.tar.gz, cifar-100-python.tar.gz, or a .tar, .tar.gz, .tar.xz or .zip of an image folder",
    )
    parser.add_argument(
        "--data-dir",
        help=f"where the folder goes (default: {cifar10_folder.CACHE}/<what the archive holds>, such as "
        f"{cifar10_folder.CIFAR10_FOLDER})",
    )


def interrupt(signal_number, frame):
    """SIGTERM as Ctrl-C: the scratch folder goes, and the command ends with one line."""
    raise KeyboardInterrupt


def run(arguments):
    signal.signal(signal.SIGTERM, interrupt)
    data_dir = arguments.data_dir or os.path.join(cifar10_folder.CACHE, cifar10_folder.folder_name(arguments.archive))
    already = cifar10_folder.is_made(data_dir)
    folder = cifar10_folder.extract(arguments.archive, data_dir)
    counts = cifar10_folder.counts(folder)
    print(
        f"{'Already made' if already else 'Made'}: {folder}, {counts['train'][0]:,} training and "
        f"{counts['test'][0]:,} test images in {counts['train'][1]} classes"
        + (" (remove it to make it again)." if already else ".")
    )
    return 0
