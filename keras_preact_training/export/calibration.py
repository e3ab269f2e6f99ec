"""The images that calibrate an int8 export.

Static quantization measures the range of every activation on representative inputs and
fixes each tensor's scale from it (onnxruntime's `quantize_static`, LiteRT's
`representative_dataset`). Those inputs are images as the network sees them: training
images of the network's own size and channels, a few hundred of them (200-500 is usual;
more only slows the export). They are never resized here: an image of another size would
calibrate on pixels the network is not given.
"""

import os

import numpy as np

from ..data import images

HOW = "name a few hundred training images of the network's size (files or folders: --calibration-images)"


def calibration_pixels(images, shape):
    """uint8 pixels [count, height, width, channels] of the calibration images.

    Args:
        images: image files and folders of them (JPEG, PNG, GIF, BMP; a folder is read
            recursively, in sorted order), or an array of pixels [count, *shape] (0-255).
        shape: the network's input (height, width, channels).

    Raises:
        ValueError: for no images, an image of another size or channels (named, with its
            shape), an array of another shape or outside 0-255, or a file that does not decode.
        FileNotFoundError: for a path that does not exist.
    """
    shape = tuple(shape)
    if images is None or len(images) == 0:
        raise ValueError(f"int8 export needs calibration images: {HOW}. Received: no images")
    if isinstance(images, np.ndarray):
        return checked_array(images, shape)
    pixels = [decoded(path, shape) for path in image_files(images)]
    if not pixels:
        raise ValueError(f"int8 export needs calibration images: {HOW}. Received: folders without images {images!r}")
    return np.stack(pixels)


def checked_array(images, shape):
    if images.ndim != 4 or images.shape[1:] != shape:
        raise ValueError(
            f"Calibration pixels must be an array [count, {', '.join(map(str, shape))}] (the network's input). "
            f"Received: an array of shape {images.shape}"
        )
    if images.dtype != np.uint8 and (np.isnan(images).any() or images.min() < 0 or images.max() > 255):
        raise ValueError(f"Calibration pixels must be 0-255. Received: values from {images.min()} to {images.max()}")
    return images.astype(np.uint8)


def image_files(paths):
    """The image files of `paths`: files as given, folders' images recursively in sorted order."""
    found = []
    for path in paths:
        if os.path.isdir(path):
            found.extend(
                sorted(
                    os.path.join(root, name)
                    for root, _, names in os.walk(path)
                    for name in images.image_names(root, names)
                )
            )
        elif os.path.isfile(path):
            found.append(path)
        else:
            raise FileNotFoundError(f"No calibration image or folder {path!r}.")
    return found


def decoded(path, shape):
    """One calibration image's pixels, checked to be of `shape`, decoded once as training and
    serving decode them (`data.images.decode`: JPEGs with the accurate DCT)."""
    with open(path, "rb") as file:
        encoded = file.read()
    try:
        height, width, channels = images.size_and_channels(encoded)
        if (height, width, channels) == tuple(shape):
            return images.decode(encoded, channels)
    except ValueError as error:
        raise ValueError(
            f"The calibration image {path} is not a JPEG, PNG, GIF or BMP image that decodes: {error}"
        ) from None
    expected_height, expected_width, expected_channels = shape
    raise ValueError(
        f"Calibration images must be {expected_height}x{expected_width} with {expected_channels} "
        f"channel{'s' * (expected_channels > 1)}, as the network sees them (they are not resized: {HOW}). "
        f"Received: {path}, {height}x{width} with {channels} channel{'s' * (channels > 1)}"
    )
