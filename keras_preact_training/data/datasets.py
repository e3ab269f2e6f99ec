"""Data sets, their splits and the order of their examples; which input pipeline reads them.

The order of the training examples is a pure function of (seed, epoch, position), so a
resumed run skips exactly the examples it has seen, before decoding them, and every
worker of a multi-worker run computes the same order and keeps its own share. Epochs
use only full global batches.

Two input pipelines read the same splits in the same order into the same batches:
`input_tensorflow` (tf.data: the default where TensorFlow is installed, and the one
`tf.distribute` needs) and `input_numpy` (NumPy and Pillow only: training and evaluation
under JAX or PyTorch without TensorFlow). This module imports neither TensorFlow nor Pillow.
"""

import dataclasses
import functools
import importlib
import importlib.util
import os

import numpy as np

from .. import tensorflow_import
from .cifar10_folder import ROUTE, check_folder
from .images import IMAGE_SUFFIXES, image_names

# Examples held back as the test split of the digits (the last 360 of scikit-learn's
# 1,797, about 20 % and 33-37 of each class).
DIGITS_TEST_EXAMPLES = 360
# The input pipelines (`Config.input_pipeline`), by name: their modules in this package.
PIPELINES = {"tensorflow": "input_tensorflow", "numpy": "input_numpy"}
# Data sets only TensorFlow reads (tensorflow-datasets' records).
TENSORFLOW_DATASETS = ("cifar10", "cifar100", "imagenet2012")
# How many unreadable files an error lists.
UNREADABLE_LISTED = 3


@dataclasses.dataclass
class Split:
    """One split: `items` (pixels, or image files' paths), `labels`, and how to decode an item.

    `items` is an array indexed by example: uint8 or float pixels [examples, height, width,
    channels], or paths of image files, which decode to `image_size` x `image_size`. A
    split of tensorflow-datasets holds encoded records and its TensorFlow `decode`;
    `stream`, for data sets too large for memory, is a `tf.data.Dataset` of (item, label)
    in a fixed order, with `size` examples.
    """

    labels: np.ndarray = None
    items: np.ndarray = None
    stream: object = None
    size: int = None
    decode: object = None
    image_size: int = None

    def __post_init__(self):
        if self.size is None:
            self.size = len(self.labels)


@dataclasses.dataclass
class DataSet:
    """The splits of a data set; `validation` is held out of the training set, or `None`."""

    train: Split
    test: Split
    class_names: list
    image_shape: tuple
    validation: Split = None


def load(config, splits=("train", "test")):
    """The data set of `config`, its splits cut to `train_examples` and `test_examples`.

    Every file of an image folder's splits is decoded once here by the config's input
    pipeline (`prepare`: tf.data checks each file, NumPy's keeps their pixels in memory; the
    times are in docs/benchmarks.md, "The input pipelines"), so that a truncated or corrupt
    image is an error that names it before training, not a traceback of the pipeline.

    Args:
        config: a `keras_preact_training.train.configs.Config`.
        splits: the splits read, of "train" (with its validation split) and "test"; the
            others are `None` and their files are not decoded (evaluating the test split
            need not decode 50,000 training images).

    Raises:
        FileNotFoundError: for a data directory that does not exist or has no images.
        ValueError: for an unknown data set, or an image folder with an empty class
            folder, test classes that train/ has not, or files that do not decode.
    """
    unknown = [name for name in splits if name not in ("train", "test")]
    if unknown or not splits:
        raise ValueError(f"splits must be some of ['train', 'test']. Received: splits={splits!r}")
    pipeline = input_pipeline(config)
    if config.dataset in TENSORFLOW_DATASETS:
        if input_pipeline_name(config) != "tensorflow":
            raise ValueError(
                f"dataset={config.dataset} is read through tensorflow-datasets, which needs TensorFlow. "
                f"Received: input_pipeline=numpy. Install TensorFlow, or train with --set "
                f"dataset=folder on {ROUTE}."
            )
        data = pipeline.tfds_dataset(config)
    elif config.dataset in ("digits", "folder"):
        data = digits(config) if config.dataset == "digits" else image_folder(config)
    else:
        raise ValueError(
            f"dataset must be one of {['digits', 'folder', *TENSORFLOW_DATASETS]}. Received: dataset={config.dataset!r}"
        )
    if "train" not in splits:
        data.train = None
    elif config.validation_examples is not None:
        data.train, data.validation = hold_out(data.train, config.validation_examples, config.seed)
    if "test" not in splits:
        data.test = None
    if data.train is not None:
        data.train = subset(data.train, config.train_examples, config.seed)
    if data.test is not None:
        data.test = subset(data.test, config.test_examples, config.seed)
    for name in ("train", "validation", "test"):
        if getattr(data, name) is not None:
            setattr(data, name, pipeline.prepare(getattr(data, name), name))
    return data


def input_pipeline_name(config):
    """The input pipeline `config` trains and evaluates through: `config.input_pipeline`, or
    where that is None, "tensorflow" where TensorFlow is installed and "numpy" where not."""
    if config.input_pipeline is not None:
        return config.input_pipeline
    return "tensorflow" if tensorflow_import.tensorflow_installed() else "numpy"


def input_pipeline(config):
    """The module of `config`'s input pipeline (`input_pipeline_name`): `input_tensorflow` or
    `input_numpy`, each with `prepare`, `training_arrays` and `evaluation_arrays`.

    Raises:
        ImportError: for the TensorFlow pipeline where TensorFlow is not installed.
    """
    name = input_pipeline_name(config)
    if name == "tensorflow" and not tensorflow_import.tensorflow_installed():
        raise ImportError(
            "input_pipeline=tensorflow needs TensorFlow, which is not installed. Received: "
            "input_pipeline='tensorflow'. Install it (pip install tensorflow), or read the data with "
            "NumPy and Pillow: --set input_pipeline=numpy (under KERAS_BACKEND=jax or torch)."
        )
    # By name: the NumPy pipeline's runs, under JAX or PyTorch, never import TensorFlow's module.
    return importlib.import_module(f"{__package__}.{PIPELINES[name]}")


def folder_name(data_dir):
    """A data folder as a user names it: its own name ("cifar10-png"), not the machine's path to it."""
    return os.path.basename(os.path.normpath(data_dir))


def name(config):
    """The data of `config` as a plot's title names it: an image folder by its own name
    (`folder_name`), any other data set by its name."""
    return folder_name(config.data_dir) if config.dataset == "folder" else config.dataset


def validation_split(size, validation_examples, seed):
    """(training indices, validation indices): a fixed random `validation_examples` of the
    training set held out, the rest trained on. Disjoint, together every index once."""
    if not isinstance(validation_examples, int) or not 0 < validation_examples < size:
        raise ValueError(
            f"validation_examples must be an integer between 1 and the training set's size less one "
            f"({size - 1}). Received: validation_examples={validation_examples!r}"
        )
    order = np.random.default_rng(seed).permutation(size)
    return np.sort(order[validation_examples:]), np.sort(order[:validation_examples])


def hold_out(split, validation_examples, seed):
    """(training split, validation split): `validation_split` applied to an indexed split."""
    if split.items is None:
        raise ValueError(
            "validation_examples needs a data set held in memory (CIFAR, the digits, an image folder), "
            f"not a streamed one. Received: a split of {split.size} streamed examples"
        )
    training, validation = validation_split(split.size, validation_examples, seed)
    return tuple(
        dataclasses.replace(split, items=split.items[keep], labels=split.labels[keep], size=len(keep))
        for keep in (training, validation)
    )


def subset(split, examples, seed, shuffled=False):
    """`examples` of the split (all for `None`): a fixed random subset of indexed data, not
    the first files of the first classes, in the split's order (or, `shuffled`, in a random
    order: every batch of it a mix of classes); the first records of a stream."""
    if examples is None or (examples >= split.size and not shuffled):
        return split
    if split.items is None:
        return dataclasses.replace(split, stream=split.stream.take(examples), size=min(examples, split.size))
    keep = subset_positions(split.size, examples, seed, shuffled)
    return dataclasses.replace(split, items=split.items[keep], labels=split.labels[keep], size=len(keep))


def subset_positions(size, examples, seed, shuffled=False):
    """The positions in a split of `size` indexed examples that `subset` keeps (all for `None`)."""
    if examples is None or (examples >= size and not shuffled):
        return np.arange(size)
    keep = np.random.default_rng(seed).permutation(size)[:examples]
    return keep if shuffled else np.sort(keep)


def digits(config):
    """scikit-learn's 1,797 8x8 handwritten digits (UCI), shipped inside the package.

    Pixels of 0-16 are scaled to 0-255 so that the pipeline is the same as for photos.
    """
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.round(bunch.images * 255 / 16).astype("uint8")[..., None]
    labels = bunch.target.astype("int64")
    cut = len(images) - DIGITS_TEST_EXAMPLES
    return DataSet(
        train=Split(items=images[:cut], labels=labels[:cut]),
        test=Split(items=images[cut:], labels=labels[cut:]),
        class_names=[str(digit) for digit in range(10)],
        image_shape=(8, 8, 1),
    )


def image_folder(config):
    """An image folder `data_dir/{train,test}/<class>/<image>`, the layout that
    `tfds.folder_dataset.ImageFolder` and `keras.utils.image_dataset_from_directory` read.

    Classes are the sorted folder names of `train/`. Images are decoded to RGB and, where
    their size differs from `image_size`, resized.
    """
    root = config.data_dir
    check_folder(root)
    class_names = sorted(entry.name for entry in os.scandir(os.path.join(root, "train")) if entry.is_dir())
    test_classes = sorted(entry.name for entry in os.scandir(os.path.join(root, "test")) if entry.is_dir())
    unknown = [name for name in test_classes if name not in class_names]
    if unknown:
        raise ValueError(
            f"{os.path.join(root, 'test')} has classes that train/ has not, which the network could "
            f"never predict: {unknown}. Received: data_dir={root!r}"
        )
    splits = {}
    for split in ("train", "test"):
        paths, labels = [], []
        for label, name in enumerate(class_names):
            folder = os.path.join(root, split, name)
            files = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
            paths += [os.path.join(folder, file) for file in image_names(folder, files)]
            if split == "train" and len(paths) == len(labels):
                raise ValueError(
                    f"The class folder {folder} holds no images ({', '.join(IMAGE_SUFFIXES)}): "
                    f"every folder of train/ is a class. Remove it or add its images. "
                    f"Received: data_dir={root!r}"
                )
            labels += [label] * (len(paths) - len(labels))
        if not paths:
            raise FileNotFoundError(
                f"No images in {os.path.join(root, split)}/<class>/: --data-dir must be "
                f"{ROUTE}. Received: data_dir={root!r}"
            )
        splits[split] = Split(items=np.array(paths), labels=np.array(labels, "int64"), image_size=config.image_size)
    return DataSet(splits["train"], splits["test"], class_names, (config.image_size, config.image_size, 3))


def holds_files(split):
    """Whether `split`'s items are image files' paths (decoded as they are read)."""
    return split.items is not None and split.items.dtype.kind in "SU"


def raise_for_unreadable(unreadable, name):
    """Raises a ValueError naming `unreadable`, files of the split `name` ("train", "test", ...)
    that do not decode as images, if there are any (at most UNREADABLE_LISTED are found)."""
    if unreadable:
        raise ValueError(
            f"The {name} split holds files that do not decode as images (truncated or corrupt): "
            f"{unreadable}{' ...' if len(unreadable) == UNREADABLE_LISTED else ''}. Replace or remove them."
        )


def example_indices(positions, size, used, seed):
    """The indices into a split of `size` examples of the stream of epochs' `positions`: each
    epoch is the first `used` places of a permutation of the split, seeded by (seed, epoch)."""
    positions = np.asarray(positions, np.int64)
    epochs, places = np.divmod(positions, used)
    indices = np.empty(len(positions), np.int64)
    for epoch in np.unique(epochs):
        these = epochs == epoch
        indices[these] = epoch_order(size, used, seed, int(epoch))[places[these]]
    return indices


@functools.lru_cache(maxsize=2)
def epoch_order(size, used, seed, epoch):
    """The indices of epoch `epoch`'s examples in their order: the first `used` of a random
    permutation of the split's `size`, from NumPy's generator seeded by (seed, epoch). The one
    order of examples: both input pipelines read it (`input_tensorflow` through
    `tf.numpy_function`), so their batches are the same and a run resumes on either. Computed
    once an epoch: a run's batches read it in turn."""
    order = np.random.default_rng([seed, epoch]).permutation(size)[:used]
    order.flags.writeable = False
    return order
