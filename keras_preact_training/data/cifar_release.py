"""CIFAR-10's and CIFAR-100's original releases for Python (`cifar-10-python.tar.gz` and
`cifar-100-python.tar.gz`, as `keras.datasets` and tensorflow-datasets download them) turned
into the image folders the zoo trains on.

CIFAR-10's release is a folder `cifar-10-batches-py/` of pickled batches: `data_batch_1` to
`data_batch_5` (the 50,000 training images in order), `test_batch` (the 10,000 test images)
and `batches.meta` (the class names, `label_names`). CIFAR-100's is a folder
`cifar-100-python/` holding `train`, `test` and `meta` (`fine_label_names`), each image with a
fine and a coarse label; its fine labels (100 classes) are the ones kept, as
`keras.datasets.cifar100.load_data()` gives by default. Each batch holds `data`, a uint8 array
of one row per image, its 1,024 red, then green, then blue values row by row, and the class
ids. `write_image_folder` writes each image as `<split>/<class>/NNNN.png` with NNNN its index
within its class in the release's order, the names of `cifar10-png.tar.xz` and
`cifar100-png.tar.xz` (the data sets with their original pixels, on which the zoo's networks
are trained and measured), so that a user with the official file gets the zoo's folder.

The batches are Python pickles, which can run code as they load: only the few names a batch
needs (NumPy's arrays and dtypes, bytes) are accepted, anything else is an error.
"""

import dataclasses
import io
import os
import pickle

import numpy as np

SIDE = 32
CHANNELS = 3
# What a batch pickle may name (module, name): NumPy's array reconstruction under NumPy 1's and
# 2's module paths, and the codec Python 3's protocol-2 pickles write bytes with.
PICKLE_GLOBALS = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("_codecs", "encode"),
}


@dataclasses.dataclass(frozen=True)
class Release:
    """One data set's release for Python.

    Attributes:
        name: the data set ("CIFAR-10"), as errors name it.
        folder: the release's folder in its archive.
        training, test: its batch files of each split, in order.
        meta: the file of its class names, under the key `names_key`.
        labels_key: the key of the labels kept in each batch.
        image_folder: the name of the image folder made from it (the name of the PNG archive's folder).
    """

    name: str
    folder: str
    training: tuple
    test: tuple
    meta: str
    names_key: str
    labels_key: str
    image_folder: str

    def files(self):
        return (self.meta, *self.test, *self.training)


RELEASES = (
    Release(
        "CIFAR-10",
        "cifar-10-batches-py",
        tuple(f"data_batch_{number}" for number in range(1, 6)),
        ("test_batch",),
        "batches.meta",
        "label_names",
        "labels",
        "cifar10-png",
    ),
    Release(
        "CIFAR-100",
        "cifar-100-python",
        ("train",),
        ("test",),
        "meta",
        "fine_label_names",
        "fine_labels",
        "cifar100-png",
    ),
)


class BatchUnpickler(pickle.Unpickler):
    """A pickle reader that builds only what `PICKLE_GLOBALS` names."""

    def find_class(self, module, name):
        if (module, name) not in PICKLE_GLOBALS:
            raise pickle.UnpicklingError(f"a CIFAR batch names no {module}.{name}")
        return super().find_class(module, name)


def release_in(folder):
    """The `Release` whose files `folder` holds (CIFAR-10's `cifar-10-batches-py/` or CIFAR-100's
    `cifar-100-python/`), or `None`."""
    return next(
        (
            release
            for release in RELEASES
            if all(os.path.isfile(os.path.join(folder, name)) for name in release.files())
        ),
        None,
    )


def read_batch(path):
    """{key: value} of one pickled batch, keys as str (the release's are bytes)."""
    with open(path, "rb") as file:
        try:
            batch = BatchUnpickler(io.BytesIO(file.read()), encoding="bytes").load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as error:
            raise ValueError(f"{path} is not a CIFAR batch: {error}") from None
    if not isinstance(batch, dict):
        raise ValueError(f"{path} is not a CIFAR batch: it holds a {type(batch).__name__}, not a dict")
    return {key.decode() if isinstance(key, bytes) else key: value for key, value in batch.items()}


def class_names(folder, release):
    """The class names of the release in `folder`, in label order."""
    path = os.path.join(folder, release.meta)
    names = read_batch(path).get(release.names_key)
    if not isinstance(names, list) or not names:
        raise ValueError(f"{path} holds no {release.names_key}")
    return [name.decode() if isinstance(name, bytes) else str(name) for name in names]


def pixels_and_labels(path, classes, labels_key):
    """(uint8 images [N, 32, 32, 3], int labels [N]) of one batch file, checked."""
    batch = read_batch(path)
    data, labels = batch.get("data"), batch.get(labels_key)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2:
        raise ValueError(f"{path} is not a CIFAR batch: its data is not a 2-D uint8 array")
    if data.shape[1] != CHANNELS * SIDE * SIDE or labels is None or len(labels) != len(data):
        raise ValueError(
            f"{path} is not a CIFAR batch: {data.shape[1]} values an image (3,072 expected) "
            f"and {None if labels is None else len(labels)} {labels_key} for {len(data)} images"
        )
    labels = np.asarray(labels)
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        raise ValueError(f"{path} is not a CIFAR batch: {labels_key} outside 0..{classes - 1}")
    return data.reshape(-1, CHANNELS, SIDE, SIDE).transpose(0, 2, 3, 1), labels


def write_image_folder(folder, release, destination):
    """Writes the release `release` in `folder` as an image folder
    `destination/{train,test}/<class>/NNNN.png`.

    Raises:
        ValueError: for a batch that is not the release's format.
    """
    from PIL import Image

    names = class_names(folder, release)
    for split, batches in (("train", release.training), ("test", release.test)):
        for name in names:
            os.makedirs(os.path.join(destination, split, name), exist_ok=True)
        written = [0] * len(names)
        for batch in batches:
            images, labels = pixels_and_labels(os.path.join(folder, batch), len(names), release.labels_key)
            for image, label in zip(images, labels):
                path = os.path.join(destination, split, names[label], f"{written[label]:04d}.png")
                Image.fromarray(image).save(path, format="PNG")
                written[label] += 1
    return destination
