"""`keras-preact evaluate`: the test (or training-set) error and per-class accuracy of shipped
weights or a weights file."""

import os

from .. import train
from ..data import cifar10_folder
from .arguments import model_name

HELP = "test (or training-set) error and per-class accuracy of shipped weights or a weights file"
DESCRIPTION = (
    "Evaluate a network with keras-preact's shipped weights (--weights cifar10 or cifar100, checked against "
    "their SHA-256) or a .weights.h5 file saved from the same network on the test split (or, with --split "
    "train, the training split) of a CIFAR-10-like data set: 0-255 pixels normalised with the data set's "
    "statistics inside the model (CIFAR-100's for its classes, CIFAR-10's otherwise), one original image each."
)
TENSORFLOW = "optional"
BACKENDS = ("tensorflow", "jax", "torch")


def add_arguments(parser):
    parser.add_argument("--model", required=True, help="the network, a name of keras_preact.list_models()")
    parser.add_argument(
        "--weights",
        default="cifar10",
        help="'cifar10' or 'cifar100' for the shipped weights ('cifar10' by default), or a .weights.h5 file",
    )
    parser.add_argument(
        "--dataset",
        default="folder",
        choices=["folder", "cifar10"],
        help="an image folder data_dir/{train,test}/<class>/ (default), or tensorflow-datasets' cifar10",
    )
    parser.add_argument(
        "--data-dir",
        help="the image folder (default: keras-preact data's, "
        f"{cifar10_folder.CIFAR10_FOLDER}, or {cifar10_folder.CIFAR100_FOLDER} for --weights cifar100), or "
        "tensorflow-datasets' data directory",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=train.EVALUATION_BATCH_SIZE,
        help=f"images per inference batch (default: {train.EVALUATION_BATCH_SIZE})",
    )
    parser.add_argument(
        "--flip",
        action="store_true",
        help="also report the error of the test-time flip: each image's class from the mean "
        "of its and its mirror image's probabilities",
    )
    parser.add_argument(
        "--split",
        default="test",
        choices=list(train.EVALUATION_SPLITS),
        help="the split measured: test (default), or train for how well the network fits "
        "its training images (inference mode, no augmentation)",
    )


def check(arguments):
    """The network, the weights file and the image folder, checked before TensorFlow loads."""
    arguments.model = model_name(arguments.model)
    if arguments.weights not in cifar10_folder.FOLDERS and not os.path.isfile(arguments.weights):
        raise FileNotFoundError(
            f"The weights file {arguments.weights} is missing: give the path of a .weights.h5 file saved from "
            f"{arguments.model}, or {' or '.join(cifar10_folder.FOLDERS)} for the shipped weights. "
            f"Received: --weights {arguments.weights!r}"
        )
    if arguments.dataset == "folder":
        cifar10_folder.check_folder(cifar10_folder.or_default(arguments.data_dir, arguments.weights))


def run(arguments):
    from ..train import evaluate

    result = evaluate.evaluate(
        arguments.model,
        arguments.weights,
        arguments.dataset,
        arguments.data_dir,
        arguments.batch_size,
        arguments.flip,
        arguments.split,
    )
    print("\n".join(evaluate.report(arguments.model, arguments.weights, result)))
    return 0
