"""`keras-preact data`: the CIFAR-10 image folder that `evaluate` and the docs' commands read,
made from CIFAR-10's release for Python or from an archive of an image folder."""

from ..data import cifar10_folder

HELP = "make the CIFAR-10 image folder that evaluate and the docs' commands read, from an archive"
DESCRIPTION = (
    "Make the image folder (train/<class>/<image> and test/<class>/<image>) that `keras-preact "
    f"evaluate` reads by default ({cifar10_folder.CIFAR10_FOLDER}), or --data-dir, from CIFAR-10's release for "
    "Python (cifar-10-python.tar.gz, as keras.datasets downloads it: its images become PNG files, the zoo's "
    "data) or from an archive of an image folder; once: a folder already made is left as it is, and a folder "
    "that it did not make is never touched."
)
TENSORFLOW = "never"
BACKENDS = None


def add_arguments(parser):
    parser.add_argument(
        "archive", help="cifar-10-python.tar.gz, or a .tar, .tar.gz, .tar.xz or .zip of an image folder"
    )
    parser.add_argument(
        "--data-dir",
        default=cifar10_folder.CIFAR10_FOLDER,
        help=f"where the folder goes (default: {cifar10_folder.CIFAR10_FOLDER})",
    )


def run(arguments):
    already = cifar10_folder.is_made(arguments.data_dir)
    folder = cifar10_folder.extract(arguments.archive, arguments.data_dir)
    counts = cifar10_folder.counts(folder)
    print(
        f"{'Already made' if already else 'Made'}: {folder}, {counts['train'][0]:,} training and "
        f"{counts['test'][0]:,} test images in {counts['train'][1]} classes"
        + (f" (remove it and {folder}.done to make it again)." if already else ".")
    )
    return 0
