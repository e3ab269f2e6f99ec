"""Encoded images to the network's input with simplejpeg, Pillow and NumPy: the one decoder
of the NumPy input pipeline, int8 calibration and the onnxruntime server (which imports
neither TensorFlow nor Keras), computing what the SavedModel's `serving_default` computes
with TensorFlow (`input_tensorflow.decode_image` and the export's resize and crop).

The pixels equal TensorFlow's for every file the server accepts (`serving.image_formats.check`
refuses those where they would not): JPEG (both decode with libjpeg-turbo's accurate integer
DCT, here through simplejpeg), PNG, GIF (its first frame, `gif_rgb`) and BMP, to
1 or 3 channels; the resize is TensorFlow's bilinear resize
(`tf.image.resize`: half-pixel centres, no antialiasing) in float32, in TensorFlow's order
of operations (tests/test_serving_onnx.py compares them pixel for pixel).
"""

import io
import os

import numpy as np
import simplejpeg
from PIL import Image

# The file names of images, as image folders and calibration folders are read: the formats both
# decoders read.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif")


def image_names(folder, names):
    """The `names` in `folder` that end with an image suffix, each checked to be a regular file.

    Raises:
        ValueError: naming it, for one that is not (a FIFO, a socket, a device or a folder, where
            reading would wait for a writer or never end).
    """
    images = [name for name in names if name.lower().endswith(IMAGE_SUFFIXES)]
    for name in images:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise ValueError(
                f"{path} is named like an image but is not a regular file (a FIFO, a socket, a device or a folder): "
                f"move it out of the folder. Received: {path!r}"
            )
    return images


# How encoded images reach the network's size: resized where their size differs (CIFAR,
# the digits, image folders), or ImageNet's evaluation crop: the shorter side resized to
# RESIZE_RATIO of the network's size, then the central square (He et al. 2016, section 4.2,
# after Krizhevsky et al. 2012: 256 for 224).
CROPS = ("resize", "central_crop")
RESIZE_RATIO = 256 / 224
# Formats decoded to their own channels, then converted (`to_channels`), as `export.decode`
# does with TensorFlow's GIF and BMP decoders; JPEG and PNG decode to the channels asked.
OWN_CHANNELS = ("GIF", "BMP")
# Pillow's names of JPEG files: an MPO (a camera's several JPEGs in one file) is decoded as
# its first JPEG, as TensorFlow does.
JPEG_FORMATS = ("JPEG", "MPO")
# libjpeg's warnings that its data ends before the image does (JWRN_HIT_MARKER, JWRN_JPEG_EOF):
# TensorFlow's decoder refuses a JPEG for them ("Premature end of JPEG data"), and decodes
# through every other warning (measured, TensorFlow 2.21).
TRUNCATING_WARNINGS = ("premature end of data segment", "Premature end of JPEG file")
# `tf.image.rgb_to_grayscale`'s weights (ITU-R BT.601), for GIF and BMP.
GREY_WEIGHTS = np.array([0.2989, 0.5870, 0.1140], np.float32)
# libpng's weights of red, green and blue for colour PNGs decoded to grey, in units of
# 2**-15 (0.299 and 0.587 as TensorFlow sets them, truncated; blue the rest), measured to equal
# TensorFlow 2.21's output.
PNG_GREY_WEIGHTS = (9797, 19234, 3737)


def decode(encoded, channels):
    """Encoded JPEG, PNG, GIF or BMP bytes -> uint8 pixels [height, width, channels], as
    TensorFlow decodes them for the SavedModel.

    JPEG: `decode_jpeg`. PNG: grey repeated to RGB, alpha dropped (not composited), a
    palette expanded, 16 bits to their high byte; to grey with libpng's weights. GIF: its
    first frame in RGB, transparent pixels black (`gif_rgb`); BMP: its own channels; then alpha
    dropped, grey repeated, RGB to grey with `GREY_WEIGHTS`.

    Raises:
        ValueError: for bytes that do not decode.
    """
    try:
        with Image.open(io.BytesIO(encoded)) as image:
            kind = image.format
            if kind in JPEG_FORMATS:
                return decode_jpeg(encoded, channels, image)
            if kind == "GIF":
                return to_channels(gif_rgb(image), channels)
            if kind in OWN_CHANNELS:
                return to_channels(own_channels(image), channels)
            if image.mode.startswith("I"):  # 16-bit grey: its high byte
                grey = (np.asarray(image).astype(np.uint32) >> 8).astype(np.uint8)[..., None]
                return grey if channels == 1 else np.repeat(grey, 3, axis=-1)
            if channels == 3:
                return np.asarray(image.convert("RGB"))
            if image.mode in ("L", "LA"):
                return np.asarray(image.convert("L"))[..., None]
            return png_grey(image)
    except (OSError, ValueError, SyntaxError, EOFError) as error:  # what Pillow raises for damaged files
        raise ValueError(f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:120]}") from None


def decode_jpeg(encoded, channels, image):
    """A JPEG (or an MPO's first frame) decoded by libjpeg-turbo through simplejpeg as
    TensorFlow's decoder does: the accurate integer DCT, fancy upsampling, grey as libjpeg's
    luminance, and a file refused where TensorFlow refuses it: where libjpeg warns that its
    data ends before the image does (`TRUNCATING_WARNINGS`), where Pillow would decode what
    it can. Other warnings (bytes before a marker, an inconsistent progression) are decoded
    through, as TensorFlow does. A CMYK JPEG (`image`'s mode; to 3 channels, since
    `containers.check` refuses it for 1) is checked so, then converted by Pillow, whose
    conversion to RGB equals TensorFlow's."""
    if image.mode == "CMYK":
        jpeg_pixels(encoded, "CMYK")
        return np.asarray(image.convert("RGB"))
    return jpeg_pixels(encoded, "RGB" if channels == 3 else "GRAY")


def jpeg_pixels(encoded, colourspace):
    """simplejpeg's pixels of `encoded`, strict first: a ValueError for a truncating warning,
    decoded again without strictness for any other."""
    try:
        return simplejpeg.decode_jpeg(encoded, colorspace=colourspace, fastdct=False, fastupsample=False, strict=True)
    except ValueError as warning:
        if any(text in str(warning) for text in TRUNCATING_WARNINGS):
            raise
    return simplejpeg.decode_jpeg(encoded, colorspace=colourspace, fastdct=False, fastupsample=False, strict=False)


def size_and_channels(encoded):
    """(height, width, channels) of encoded image bytes from their header alone, the channels
    being those TensorFlow's decoder gives the file as it is (`tf.io.decode_image` without
    `channels`): grey 1, grey with alpha 2, RGB 3, RGBA (or a palette with transparency) 4.

    Raises:
        ValueError: for bytes that are no JPEG, PNG, GIF or BMP image.
    """
    try:
        with Image.open(io.BytesIO(encoded)) as image:
            if image.format not in (*JPEG_FORMATS, "PNG", *OWN_CHANNELS):
                raise ValueError(f"a {image.format} image, where JPEG, PNG, GIF or BMP is expected")
            if image.mode == "P":
                channels = 4 if "transparency" in image.info else 3
            elif image.mode in ("1", "L") or image.mode.startswith("I"):
                channels = 1
            else:
                channels = len(image.getbands())
            return image.height, image.width, channels
    except (OSError, SyntaxError, EOFError) as error:  # what Pillow raises for damaged files
        raise ValueError(f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:120]}") from None


def gif_rgb(image):
    """A GIF's first frame as TensorFlow's GIF decoder gives it: RGB from the palette, transparent
    pixels black (0, 0, 0)."""
    image.seek(0)
    rgba = np.asarray(image.convert("RGBA"))
    return np.where(rgba[..., 3:] > 0, rgba[..., :3], 0).astype(np.uint8)


def own_channels(image):
    """A BMP's pixels in the channels TensorFlow's decoder gives: grey, RGB or RGBA."""
    if image.mode in ("L", "1"):
        return np.asarray(image.convert("L"))[..., None]
    transparent = "A" in image.mode or (image.mode == "P" and "transparency" in image.info)
    return np.asarray(image.convert("RGBA" if transparent else "RGB"))


def to_channels(pixels, channels):
    """uint8 pixels [height, width, 1 to 4] as 1 or 3 channels (`input_tensorflow.to_channels`)."""
    rgb = pixels[..., :3] if pixels.shape[-1] >= 3 else np.repeat(pixels[..., :1], 3, axis=-1)
    if channels == 3:
        return rgb
    if pixels.shape[-1] < 3:
        return pixels[..., :1]
    grey = rgb.astype(np.float32) / np.float32(255) @ GREY_WEIGHTS
    # `tf.image.convert_image_dtype` back to uint8: scaled by 255.5 and truncated.
    return np.clip(grey * np.float32(255.5), 0, 255).astype(np.uint8)[..., None]


def png_grey(image):
    """A colour PNG as grey, as libpng computes it for TensorFlow (`png_set_rgb_to_gray`
    with the weights 0.299 and 0.587): in 15-bit fixed point, truncated."""
    rgb = np.asarray(image.convert("RGB")).astype(np.uint32)
    grey = (
        PNG_GREY_WEIGHTS[0] * rgb[..., 0] + PNG_GREY_WEIGHTS[1] * rgb[..., 1] + PNG_GREY_WEIGHTS[2] * rgb[..., 2]
    ) >> 15
    return grey.astype(np.uint8)[..., None]


def resize_bilinear(pixels, height, width):
    """Pixels [h, w, c] (uint8 or float32) -> float32 [height, width, c] as
    `tf.image.resize(..., "bilinear")`: half-pixel centres, no antialiasing, computed in
    float32 in TensorFlow's order (along the columns, then between the rows). Only the rows
    and columns the output reads are converted to float32 (exactly, from uint8): a 4096 x
    4096 image to 32 x 32 reads 64 of each."""
    top, bottom, row_fraction = axis_weights(pixels.shape[0], height)
    left, right, column_fraction = axis_weights(pixels.shape[1], width)

    def along_columns(rows):
        on_the_left, on_the_right = rows[:, left].astype(np.float32), rows[:, right].astype(np.float32)
        return on_the_left + (on_the_right - on_the_left) * column_fraction[None, :, None]

    upper, lower = along_columns(pixels[top]), along_columns(pixels[bottom])
    return upper + (lower - upper) * row_fraction[:, None, None]


def axis_weights(size, new_size):
    """The two source indices and the fraction between them of each output position."""
    scale = np.float32(size / new_size)
    position = (np.arange(new_size, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
    low = np.floor(position)
    fraction = (position - low).astype(np.float32)
    low = low.astype(np.int64)
    return np.clip(low, 0, size - 1), np.clip(low + 1, 0, size - 1), fraction


def crop(pixels, preprocessing):
    """uint8 pixels of any size -> float32 [image_size, image_size, channels], as
    `preprocessing.crop` does in training (`CROPS`)."""
    size = preprocessing.image_size
    height, width = pixels.shape[:2]
    if preprocessing.crop == "resize":
        if (height, width) == (size, size):
            return pixels.astype(np.float32)
        return resize_bilinear(pixels, size, size)
    scale = np.float32(size * RESIZE_RATIO) / np.float32(min(height, width))
    new_height, new_width = (int(np.round(np.float32(side) * scale)) for side in (height, width))
    resized = resize_bilinear(pixels, new_height, new_width)
    top, left = max(new_height - size, 0) // 2, max(new_width - size, 0) // 2
    return resized[top : top + size, left : left + size]


def preprocess(encoded_images, preprocessing):
    """Encoded images -> the network's normalised float32 input [batch, size, size, channels],
    as the SavedModel's serving_default computes it (`keras.layers.Normalization` over the
    mean and the variance std**2, float32).

    Raises:
        ValueError: naming the instances whose bytes do not decode.
    """
    pixels, failures = [], []
    for index, encoded in enumerate(encoded_images):
        try:
            pixels.append(crop(decode(encoded, preprocessing.channels), preprocessing))
        except ValueError as error:
            failures.append(f"instance {index} ({len(encoded)} bytes): {error}")
    if failures:
        raise ValueError("; ".join(failures))
    mean = np.array(preprocessing.normalization_mean, np.float32)
    deviation = np.sqrt(np.array([std**2 for std in preprocessing.normalization_std], np.float32))
    return (np.stack(pixels) - mean) / np.maximum(deviation, np.float32(1e-7))
