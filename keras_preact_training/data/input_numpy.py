"""The NumPy input pipeline: the splits of `keras_preact_training.data.datasets` decoded as the onnxruntime server
decodes images (`serving.images.decode`: simplejpeg for JPEG, Pillow for the others), in the order of
`keras_preact_training.data.datasets.example_indices`, batched; no TensorFlow.

It gives the batches `input_tensorflow` gives for the same config, seed and step (tested
image for image): the same order of examples, the same JPEG decoding (libjpeg-turbo's
accurate integer DCT, which simplejpeg uses and TensorFlow is asked for) and, for images of another size,
TensorFlow's bilinear resize (`serving.images.resize_bilinear`). Augmentation is not here:
it is the training model's first layers (`recipe.preprocessing`), the same on every path.

An image folder is decoded once, when it is prepared, into an array in memory (CIFAR-10's
60,000 images: 184 MB as uint8; times in docs/benchmarks.md), and batches are gathered from it;
a folder whose pixels would pass MEMORY_LIMIT_BYTES stays files, decoded batch by batch on DECODING_THREADS threads
(Pillow decodes outside Python's global lock).
"""

import concurrent.futures
import os

import numpy as np

from . import datasets, images

# The largest decoded image folder held in memory; larger ones are decoded batch by batch,
# after a check that every file decodes, CHECKED_TOGETHER files at a time.
MEMORY_LIMIT_BYTES = 4 * 2**30
CHECKED_TOGETHER = 4096
DECODING_THREADS = os.cpu_count() or 1


class UnreadableImage(ValueError):
    """A file that does not decode as an image."""


def decode_file(path, image_size):
    """An image file -> pixels [image_size, image_size, 3]: uint8 where the file has that size,
    else float32 from TensorFlow's bilinear resize, as `input_tensorflow.decode_file`.

    Raises:
        UnreadableImage: naming `path`, for a file that does not decode.
    """
    try:
        with open(path, "rb") as file:
            pixels = images.decode(file.read(), 3)
    except (OSError, ValueError) as error:
        raise UnreadableImage(str(path)) from error
    if pixels.shape[:2] == (image_size, image_size):
        return pixels
    return images.resize_bilinear(pixels, image_size, image_size)


def decode_files(paths, image_size):
    """The files' pixels, stacked as float32 where any was resized, else uint8, decoded on
    DECODING_THREADS threads; raises UnreadableImage naming up to UNREADABLE_LISTED files."""
    unreadable = []

    def decode(chunk):
        pixels = []
        for path in chunk:
            try:
                pixels.append(decode_file(path, image_size))
            except UnreadableImage:
                unreadable.append(str(path))
        return pixels

    # One contiguous chunk a thread: a task per image would cost more than its decoding.
    chunks = np.array_split(np.asarray(paths), min(DECODING_THREADS, max(len(paths), 1)))
    with concurrent.futures.ThreadPoolExecutor(len(chunks)) as pool:
        decoded = [pixels for chunk in pool.map(decode, chunks) for pixels in chunk]
    if unreadable:
        raise UnreadableImage(sorted(unreadable)[: datasets.UNREADABLE_LISTED])
    dtype = np.uint8 if all(pixels.dtype == np.uint8 for pixels in decoded) else np.float32
    return (
        np.stack([pixels.astype(dtype, copy=False) for pixels in decoded])
        if decoded
        else np.zeros((0, image_size, image_size, 3), np.uint8)
    )


def prepare(split, name):
    """`split` as this pipeline reads it: an image folder's split decoded into memory (its
    items then pixels) where it fits MEMORY_LIMIT_BYTES, else checked to decode; other splits
    as they are.

    Raises:
        ValueError: naming the files of `split` (`name`: "train", "test", ...) that do not decode.
        ValueError: for a streamed split (tensorflow-datasets' larger ones), which only
            `input_tensorflow` reads.
    """
    if split.items is None:
        raise ValueError(
            f"The {name} split is a stream of tensorflow-datasets, which only the TensorFlow input "
            "pipeline reads. Received: input_pipeline=numpy"
        )
    if not datasets.holds_files(split):
        return split
    try:
        if split.size * split.image_size**2 * 3 <= MEMORY_LIMIT_BYTES:
            return datasets.Split(labels=split.labels, items=decode_files(split.items, split.image_size))
        for start in range(0, split.size, CHECKED_TOGETHER):
            decode_files(split.items[start : start + CHECKED_TOGETHER], split.image_size)
    except UnreadableImage as error:
        datasets.raise_for_unreadable(error.args[0], name)
    return split


def gather(split, indices):
    """Images (float32) and labels (int64) of the examples `indices` of `split`."""
    if datasets.holds_files(split):
        pixels = decode_files(split.items[indices], split.image_size)
    else:
        pixels = split.items[indices]
    return pixels.astype(np.float32), split.labels[indices].astype(np.int64)


def training_arrays(split, config, steps_per_epoch, first_step, total_steps, shard=(0, 1)):
    """The training batches of steps first_step .. total_steps - 1 (counted from 0), as
    `input_tensorflow.training_batches` gives them: step s takes positions [s G, (s + 1) G) of
    the stream of epochs (`datasets.example_indices`), G the batch size; `shard` (index, count), of
    count processes that share each batch, this one's part, positions [s G + i L, s G + (i + 1) L),
    L = G / count."""
    used = steps_per_epoch * config.batch_size
    index, count = shard
    part = config.batch_size // count
    for step in range(first_step, total_steps):
        start = step * config.batch_size + index * part
        yield gather(split, datasets.example_indices(np.arange(start, start + part), split.size, used, config.seed))


def evaluation_arrays(split, batch_size):
    """Every example of `split` in its order, in batches of `batch_size` (the last one smaller)."""
    for start in range(0, split.size, batch_size):
        yield gather(split, np.arange(start, min(start + batch_size, split.size)))
