"""A `:predict` request body read and checked, and an answer written, without TensorFlow.

TF Serving's REST request (https://www.tensorflow.org/tfx/serving/api_rest):
`{"signature_name": ..., "instances": [...]}` (row format, answered with "predictions") or
`{"inputs": ...}` (columnar, answered with "outputs"); binary values such as encoded
images as `{"b64": "..."}`. Everything a client sends is bounded before it is materialised:
the values a body holds (counted before JSON parses it), the instances, and the pixels of
encoded images (read from their headers before anything decodes them).
"""

import base64
import io
import itertools
import json
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image

from . import image_formats

# What the images of one request may hold, read from their headers before decoding: one
# image at most 4096 x 4096 pixels, the request's images together four times that (about
# 200 MB decoded as RGB). A 20000 x 20000 PNG of 431 KB is refused in milliseconds.
MAX_IMAGE_PIXELS = 4096 * 4096
MAX_REQUEST_PIXELS = 4 * MAX_IMAGE_PIXELS
IMAGE_FORMATS = ("JPEG", "PNG", "GIF", "BMP")  # what tf.io.decode_image reads
UNDECODABLE = "Could not decode the image bytes (JPEG, PNG, GIF or BMP expected): "
# Top-level fields besides the instances' values that a request may add to the count of
# values (`max_separators`).
REQUEST_FIELDS_SLACK = 16
# Bytes of a body counted at a time (`count_separators`).
COUNT_SLICE = 2**20
NUMPY_DTYPES = {"uint8": np.uint8, "float32": np.float32}
# The Python types json.loads gives a JSON number (bool is not one of them, though True == 1).
JSON_NUMBERS = {int, float}


class BadRequest(ValueError):
    """A request the server cannot answer; `status` is its HTTP status."""

    def __init__(self, message, status=400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, eq=False)
class Parsed:
    """A `:predict` request read and checked: the signature, its input, the instances.

    Compared by identity (`eq=False`): two requests are never "equal", and nothing
    compares the NumPy arrays they hold."""

    signature: str
    key: str
    values: object  # a numpy array of the input's dtype, or a list of encoded images (bytes)
    row_format: bool
    # The images' decoding cost, in pixels decoded: each image's pixels from its header, a JPEG's
    # once a scan (`image_formats.decode_passes`). The batcher sorts requests by it.
    pixels: int = 0
    # Each image's (format, mode), as Pillow read them from its header: for `check_decoding`.
    kinds: tuple = ()

    def __len__(self):
        return len(self.values)


def max_separators(max_batch, image_shape):
    """The most commas a request of `max_batch` instances holds, for the largest input of
    `contract.SIGNATURES` (an image array of `image_shape`): each instance's numbers and
    nested arrays, and a few fields. Counted in the body's bytes before it is parsed, this
    bounds the values JSON makes."""
    per_instance = sum(int(np.prod(image_shape[:end])) for end in range(1, len(image_shape) + 1))
    return max_batch * per_instance + REQUEST_FIELDS_SLACK


def parse(body, signatures, image_shape, max_batch):
    """A `:predict` request body (bytes) read into a `Parsed`.

    Args:
        body: the request body.
        signatures: `contract.SIGNATURES`, the signatures served.
        image_shape: the network's (height, width, channels).
        max_batch: the most instances a request may hold.

    Raises:
        BadRequest: for malformed JSON, an unknown signature, a missing, mistyped or
            misshapen input, too large a batch, or images too large or not images.
    """
    limit = max_separators(max_batch, image_shape)
    separators = count_separators(body, limit)
    if separators > limit:
        raise BadRequest(
            f"The request holds too many values: {separators + 1:,} or more, where {max_batch} "
            f"instances (--max-batch) of this model's largest input hold at most {limit:,}.",
            413,
        )
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, ValueError) as error:  # ValueError: JSON errors, numbers of over 4,300 digits
        raise BadRequest(f"The request body is not valid JSON: {str(error)[:200]}") from None
    except RecursionError:
        raise BadRequest("The request body is nested too deeply to read.") from None
    if not isinstance(request, dict):
        raise BadRequest(f"The request must be a JSON object. Received: {type(request).__name__}")
    name = request.get("signature_name", "serving_default")
    if not isinstance(name, str) or name not in signatures:
        raise BadRequest(
            f"Unknown signature_name. Choose one of {sorted(signatures)}. Received: {json.dumps(name)[:80]}"
        )
    unknown = sorted(set(request) - {"signature_name", "instances", "inputs"})
    if unknown or ("instances" in request) == ("inputs" in request):
        raise BadRequest(
            "The request needs exactly one of 'instances' (row format) or 'inputs' (columnar), "
            f"and optionally 'signature_name'. Received keys: {keys_text(request)}"
        )
    signature = signatures[name]
    key, row_format = signature.key, "instances" in request
    values = request["instances"] if row_format else request["inputs"]
    if row_format and isinstance(values, list):
        values = [value[key] if isinstance(value, dict) and key in value else value for value in values]
    elif not row_format and isinstance(values, dict) and key in values:
        values = values[key]
    values = to_values(values, signature, signature.shape(image_shape), max_batch)
    values, pixels, kinds = (
        checked_images(values, key, image_shape[-1]) if signature.dtype == "string" else (values, 0, ())
    )
    return Parsed(name, key, values, row_format, pixels, kinds)


def to_values(values, signature, shape, max_batch):
    """The JSON value of `signature`'s input as a numpy array of its dtype and `shape` (a list
    of bytes for encoded images), or a BadRequest that says why not."""
    key = signature.key
    if not isinstance(values, list) or not values:
        raise BadRequest(
            f"Input {key!r} must be a non-empty list, one entry per instance. Received: {type(values).__name__}"
        )
    if len(values) > max_batch:
        raise BadRequest(
            f"Too many instances: this server takes at most {max_batch} per request "
            f"(--max-batch). Received: {len(values)}"
        )
    if signature.dtype == "string":
        return [binary(value, key, index) for index, value in enumerate(values)]
    not_a_number = leaf_not_a_number(values)
    if not_a_number is not None:  # NumPy would read "12" as 12 and true as 1
        raise BadRequest(
            f"Input {key!r} must be a rectangular array of numbers of shape {shape_text(shape)}. "
            f"Received: {json.dumps(not_a_number[0])[:80]}"
        )
    out_of_range = f"Input {key!r} holds uint8 pixels: integers from 0 to 255."
    try:
        array = np.asarray(values, dtype=np.float64)
    except OverflowError:  # an integer past float64's range (JSON's numbers may have 4,300 digits)
        raise BadRequest(out_of_range if signature.dtype == "uint8" else too_large(key, signature.dtype)) from None
    except (ValueError, TypeError):
        raise BadRequest(
            f"Input {key!r} must be a rectangular array of numbers of shape {shape_text(shape)}."
        ) from None
    if array.ndim != len(shape) or any(want is not None and want != got for want, got in zip(shape, array.shape)):
        raise BadRequest(f"Input {key!r} must have shape {shape_text(shape)}. Received: shape {tuple(array.shape)}")
    if signature.dtype == "uint8" and (np.any(array < 0) or np.any(array > 255) or np.any(array != np.round(array))):
        raise BadRequest(out_of_range)
    if not np.all(np.isfinite(array)):
        raise BadRequest(f"Input {key!r} holds a NaN or infinite value.")
    with np.errstate(over="ignore"):
        converted = array.astype(NUMPY_DTYPES[signature.dtype])
    if not np.all(np.isfinite(converted)):
        raise BadRequest(too_large(key, signature.dtype))
    return converted


def too_large(key, dtype):
    """The error of a value past the largest of the float type `dtype`."""
    return f"Input {key!r} holds a value too large for {dtype} (at most {np.finfo(NUMPY_DTYPES[dtype]).max:.4g})."


def leaf_not_a_number(values):
    """(leaf,) for a leaf of the nested lists `values` that is not a JSON number (a string, a
    bool, null, an object), or None where every leaf is one (ragged lists are left to NumPy's
    check of the shape). Lists of innermost lists (an image's rows) are checked whole, their
    leaves' types as a set: 12 ms for 64 CIFAR images, as long as NumPy's conversion."""
    pending = [values]
    while pending:
        value = pending.pop()
        if not isinstance(value, list):
            if type(value) not in JSON_NUMBERS:
                return (value,)
        elif value and isinstance(value[0], list) and value[0] and isinstance(value[0][0], list):
            pending.extend(value)
        elif not all(isinstance(item, list) for item in value):
            pending.extend(value)  # numbers, or numbers beside lists: one by one
        elif not set(map(type, itertools.chain.from_iterable(value))) <= JSON_NUMBERS:
            pending.extend(itertools.chain.from_iterable(value))
    return None


def binary(value, key, index):
    if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except ValueError as error:
            raise BadRequest(f"Instance {index} of {key!r}: invalid base64 ({error}).") from None
    if isinstance(value, str):
        return value.encode()
    raise BadRequest(
        f'Instance {index} of {key!r} must be {{"b64": "<base64 of the image file>"}}. '
        f"Received: {json.dumps(value)[:80]}"
    )


def count_separators(body, limit):
    """The commas of `body`, counted in slices of COUNT_SLICE bytes (each holds the GIL for a
    millisecond or two, so that the event loop runs between them) until the count passes
    `limit`: a 57 MB body of numbers is refused after its first megabyte."""
    count = 0
    for start in range(0, len(body), COUNT_SLICE):
        count += body.count(b",", start, start + COUNT_SLICE)
        if count > limit:
            break
    return count


def checked_images(images, key, channels):
    """The encoded `images` as the network of `channels` decodes them, the pixels decoding them
    costs (each image's pixels, read from its header, times its passes: `image_formats.decode_passes`)
    and each image's (format, mode), read from their headers (Pillow reads a header without decoding
    the image, once `image_formats.check_header` has bounded it): a BadRequest for files whose headers
    hold too much, that are not JPEG, PNG, GIF or BMP, whose structure the two runtimes would decode
    differently (`image_formats.check_structure`; what only a trial decode finds is
    `check_decoding`'s), for an image over MAX_IMAGE_PIXELS and for a request over
    MAX_REQUEST_PIXELS. A GIF is cut after its first frame (`image_formats.first_gif_frame`,
    without decoding it), so that no later frame is ever decoded."""
    total, cost, checked, kinds = 0, 0, [], []
    for index, encoded in enumerate(images):
        try:
            image_formats.check_header(encoded)
        except ValueError as error:
            raise BadRequest(f"{UNDECODABLE}instance {index} ({len(encoded)} bytes): {error}") from None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # refused below, by our own bound
                with Image.open(io.BytesIO(encoded), formats=IMAGE_FORMATS) as image:
                    width, height = image.size
                    image_format, mode = image.format, image.mode
        except Image.DecompressionBombError as error:  # over 179 million pixels: refused by Pillow itself
            raise BadRequest(f"Instance {index} of {key!r} is too large: {error}", 413) from None
        except Image.UnidentifiedImageError:
            raise BadRequest(
                f"{UNDECODABLE}instance {index} ({len(encoded)} bytes): Unknown image file format"
            ) from None
        except (OSError, ValueError, SyntaxError, EOFError) as error:  # a header or frame Pillow cannot read
            raise BadRequest(
                f"{UNDECODABLE}instance {index} ({len(encoded)} bytes): "
                f"{(str(error).splitlines() or [type(error).__name__])[0][:120]}"
            ) from None
        if width * height > MAX_IMAGE_PIXELS:
            raise BadRequest(
                f"Instance {index} of {key!r} is too large: {width} x {height} pixels; this server "
                f"decodes at most {MAX_IMAGE_PIXELS:,} pixels an image.",
                413,
            )
        try:
            if image_format == "GIF":  # its first frame alone: no later frame is ever decoded
                encoded = image_formats.first_gif_frame(encoded)
            image_formats.check_structure(encoded, image_format, mode, channels)
        except ValueError as error:
            raise BadRequest(f"{UNDECODABLE}instance {index} ({len(encoded)} bytes): {error}") from None
        total += width * height
        cost += width * height * image_formats.decode_passes(encoded, image_format)
        checked.append(encoded)
        kinds.append((image_format, mode))
    if total > MAX_REQUEST_PIXELS:
        raise BadRequest(
            f"The request's images are too large together: {total:,} pixels; this server decodes "
            f"at most {MAX_REQUEST_PIXELS:,} pixels a request.",
            413,
        )
    return checked, cost, tuple(kinds)


def check_decoding(parsed, channels):
    """A BadRequest for the first image of `parsed` that the two runtimes would decode differently
    in a way only a trial decode finds (`image_formats.check_decoding`): as costly as decoding, so
    run where the request's decoding would run (`application.ServingAPI`)."""
    for index, (encoded, (image_format, mode)) in enumerate(zip(parsed.values, parsed.kinds)):
        try:
            image_formats.check_decoding(encoded, image_format, mode, channels)
        except ValueError as error:
            raise BadRequest(f"{UNDECODABLE}instance {index} ({len(encoded)} bytes): {error}") from None


def concatenated(requests):
    """The instances of several `Parsed` requests of one signature, as one input."""
    if isinstance(requests[0].values, list):
        return [image for request in requests for image in request.values]
    return np.concatenate([request.values for request in requests])


def answer(parsed, outputs):
    """The JSON-ready answer to `parsed` from its `outputs` (numpy arrays by name; class
    names as bytes); non-finite outputs are a BadRequest."""
    if isinstance(outputs, BadRequest):
        raise outputs
    broken = sorted(
        {
            int(row)
            for value in outputs.values()
            if value.dtype.kind == "f"
            for row in np.nonzero(~np.isfinite(value.reshape(len(value), -1)).all(axis=1))[0]
        }
    )
    if broken:
        raise BadRequest(
            f"The network's outputs are not finite (NaN or infinite) for instances {broken[:10]}: "
            "inputs far outside the range it was trained on."
        )
    outputs = {output: to_json(value) for output, value in outputs.items()}
    if not parsed.row_format:
        return {"outputs": outputs}
    return {"predictions": [dict(zip(outputs, row)) for row in zip(*outputs.values())]}


def to_json(array):
    if array.dtype == object:
        return np.vectorize(lambda value: value.decode("utf-8", "replace"), otypes=[object])(array).tolist()
    return array.tolist()


def shape_text(shape):
    return "[" + ", ".join("batch" if size is None else str(size) for size in shape) + "]"


# An error names at most this many of a request's keys, each cut to KEY_CHARACTERS: what a
# client sent comes back in a few hundred bytes, however large its object.
SHOWN_KEYS, KEY_CHARACTERS = 8, 40


def keys_text(request):
    """A JSON object's keys as an error shows them: the first SHOWN_KEYS in order, each cut short,
    and how many more there are."""
    keys = sorted(request)
    shown = [
        json.dumps(key[:KEY_CHARACTERS] + ("..." if len(key) > KEY_CHARACTERS else "")) for key in keys[:SHOWN_KEYS]
    ]
    more = f", and {len(keys) - SHOWN_KEYS:,} more" if len(keys) > SHOWN_KEYS else ""
    return "[" + ", ".join(shown) + more + "]"
