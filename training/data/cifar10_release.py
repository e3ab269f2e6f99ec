"""CIFAR-10's original release for Python (`cifar-10-python.tar.gz`, as `keras.datasets` and
tensorflow-datasets download it) turned into the image folder the zoo trains on.

The release is a folder `cifar-10-batches-py/` of pickled batches: `data_batch_1` to
`data_batch_5` (the 50,000 training images in order), `test_batch` (the 10,000 test images)
and `batches.meta` (the class names). Each batch holds `data`, a uint8 array of one row per
image, its 1,024 red, then green, then blue values row by row, and `labels`, the class ids.
`write_image_folder` writes each image as `<split>/<class>/NNNN.png` with NNNN its index
within its class in the release's order, the names of `cifar10-png.tar.xz` (CIFAR-10 with
its original pixels, the data the zoo's networks are trained and measured on), so that a
user with the official file gets the zoo's folder.

The batches are Python pickles, which can run code as they load: only the few names a batch
needs (NumPy's arrays and dtypes, bytes) are accepted, anything else is an error.
"""

import io
import os
import pickle

import numpy as np

TRAINING_BATCHES = tuple(f"data_batch_{number}" for number in range(1, 6))
TEST_BATCH = "test_batch"
META = "batches.meta"
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


class BatchUnpickler(pickle.Unpickler):
    """A pickle reader that builds only what `PICKLE_GLOBALS` names."""

    def find_class(self, module, name):
        if (module, name) not in PICKLE_GLOBALS:
            raise pickle.UnpicklingError(f"a CIFAR-10 batch names no {module}.{name}")
        return super().find_class(module, name)


def is_release(folder):
    """Whether `folder` is the release's `cifar-10-batches-py/` (its batches and class names)."""
    return all(os.path.isfile(os.path.join(folder, name)) for name in (META, TEST_BATCH, *TRAINING_BATCHES))


def read_batch(path):
    """{key: value} of one pickled batch, keys as str (the release's are bytes)."""
    with open(path, "rb") as file:
        try:
            batch = BatchUnpickler(io.BytesIO(file.read()), encoding="bytes").load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as error:
            raise ValueError(f"{path} is not a CIFAR-10 batch: {error}") from None
    if not isinstance(batch, dict):
        raise ValueError(f"{path} is not a CIFAR-10 batch: it holds a {type(batch).__name__}, not a dict")
    return {key.decode() if isinstance(key, bytes) else key: value for key, value in batch.items()}


def class_names(release):
    """The ten class names of the release, in label order."""
    names = read_batch(os.path.join(release, META)).get("label_names")
    if not isinstance(names, list) or not names:
        raise ValueError(f"{os.path.join(release, META)} holds no label_names")
    return [name.decode() if isinstance(name, bytes) else str(name) for name in names]


def pixels_and_labels(path, classes):
    """(uint8 images [N, 32, 32, 3], int labels [N]) of one batch file, checked."""
    batch = read_batch(path)
    data, labels = batch.get("data"), batch.get("labels")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2:
        raise ValueError(f"{path} is not a CIFAR-10 batch: its data is not a 2-D uint8 array")
    if data.shape[1] != CHANNELS * SIDE * SIDE or labels is None or len(labels) != len(data):
        raise ValueError(
            f"{path} is not a CIFAR-10 batch: {data.shape[1]} values an image (3,072 expected) "
            f"and {None if labels is None else len(labels)} labels for {len(data)} images"
        )
    labels = np.asarray(labels)
    if labels.size and (labels.min() < 0 or labels.max() >= classes):
        raise ValueError(f"{path} is not a CIFAR-10 batch: labels outside 0..{classes - 1}")
    return data.reshape(-1, CHANNELS, SIDE, SIDE).transpose(0, 2, 3, 1), labels


def write_image_folder(release, destination):
    """Writes the release in `release` (the `cifar-10-batches-py` folder) as an image folder
    `destination/{train,test}/<class>/NNNN.png`.

    Raises:
        ValueError: for a batch that is not the release's format.
    """
    from PIL import Image

    names = class_names(release)
    for split, batches in (("train", TRAINING_BATCHES), ("test", (TEST_BATCH,))):
        for name in names:
            os.makedirs(os.path.join(destination, split, name), exist_ok=True)
        written = [0] * len(names)
        for batch in batches:
            images, labels = pixels_and_labels(os.path.join(release, batch), len(names))
            for image, label in zip(images, labels):
                path = os.path.join(destination, split, names[label], f"{written[label]:04d}.png")
                Image.fromarray(image).save(path, format="PNG")
                written[label] += 1
    return destination
