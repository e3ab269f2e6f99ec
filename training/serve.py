"""A server that speaks TF Serving's REST API, on uvicorn, and a client for it.

    keras-preact serve saved_models/<name> [--port 8501]
    keras-preact query --model <name> image.jpg ...   (training.client)

The server (this module) loads the highest version of a model folder, as TF Serving does, and answers

    GET  /v1/models/<name>[/versions/<version>]            the model's status
    GET  /v1/models/<name>[/versions/<version>]/metadata   its signatures and metadata.json
    POST /v1/models/<name>[/versions/<version>]:predict    predictions

with the request and response bodies of TF Serving's REST API
(https://www.tensorflow.org/tfx/serving/api_rest): `{"signature_name": ..., "instances":
[...]}` (row format, answered with "predictions") or `{"inputs": ...}` (columnar,
answered with "outputs"); binary values such as encoded images as `{"b64": "..."}`. A
client written for TF Serving works against it unchanged. Every error is TF Serving's
`{"error": "..."}` with its HTTP status, the HTTP layer's own included, and the server
goes on serving.

The HTTP stack is uvicorn (https://www.uvicorn.org) with h11, its strict pure-Python
HTTP/1.1 parser: bodies framed exactly by Content-Length or chunked encoding (a body is
never parsed as a request), a listen backlog, keep-alive timeouts. `Protocol` adds what
uvicorn lacks against hostile clients (Kludex/uvicorn#157): a deadline for receiving each
request whole, a bound on open connections, and its errors as JSON. `Application` (ASGI)
bounds the requests in flight (503 with Retry-After past it), the body while reading it
and the images' pixels from their headers before anything decodes them. `Batcher` runs
the network on a bounded pool of threads, off the event loop, and runs the requests that
arrive while every thread is busy as one batch, TF Serving's request batching. The network
is the SavedModel on TensorFlow, or (`runtime="onnxruntime"`) the version's ONNX models
behind the same three signatures (`OnnxRuntimeSignature`).
"""

import asyncio
import base64
import collections
import concurrent.futures
import functools
import http
import io
import json
import os
import re
import socket
import sys
import warnings
from dataclasses import dataclass

import h11
import numpy as np
import tensorflow as tf
import uvicorn
from PIL import Image
from uvicorn.protocols.http.h11_impl import H11Protocol

from keras_preact import pretrained
from . import contract, export
from .defaults import DEFAULT_MAX_BATCH, DEFAULT_MAX_IN_FLIGHT, DEFAULT_PORT, DEFAULT_REQUEST_TIMEOUT

# The largest request body read: 64 encoded 224 x 224 JPEGs take about 2 MB.
MAX_BODY_BYTES = 64 * 2**20
# The request line and headers together (h11's own default); past it, 414 or 431.
MAX_HEAD_BYTES = 16 * 2**10
# Connections waiting to be accepted (the standard library's default of 5 reset clients at
# 32 concurrent connections), and connections open at once (past it: 503, then closed).
LISTEN_BACKLOG = 1024
MAX_CONNECTIONS = 2048
# Seconds a kept-alive connection may sit idle between requests (uvicorn's default).
KEEP_ALIVE_SECONDS = 5
# What the images of one request may hold, read from their headers before decoding: one
# image at most 4096 x 4096 pixels, the request's images together four times that (about
# 200 MB decoded as RGB). A 20000 x 20000 PNG of 431 KB is refused in milliseconds.
MAX_IMAGE_PIXELS = 4096 * 4096
MAX_REQUEST_PIXELS = 4 * MAX_IMAGE_PIXELS
IMAGE_FORMATS = ("JPEG", "PNG", "GIF", "BMP")  # what tf.io.decode_image reads
# Formats whose files may hold several frames, each of its own size: the server decodes
# their first frame alone (Pillow) and hands it on as PNG; TensorFlow's GIF decoder would
# decode every frame, whatever the limits read from the first frame's header.
FIRST_FRAME_ONLY = ("GIF",)
UNDECODABLE = "Could not decode the image bytes (JPEG, PNG, GIF or BMP expected): "
# Top-level fields besides the instances' values that a request may add to the count of
# values (`ModelServer.max_separators`).
REQUEST_FIELDS_SLACK = 16
# Bytes of a body counted at a time (`count_separators`).
COUNT_SLICE = 2**20
# Threads that parse request bodies (JSON, base64, image headers), off the event loop: at
# most this many bodies are materialised at once.
PARSE_THREADS = 2
# Threads that run the network; each batch uses every core through TensorFlow's own
# threads, two keep the cores busy while the other thread converts and answers.
INFERENCE_THREADS = 2
# What a 503 asks the client to wait, in seconds.
RETRY_AFTER_SECONDS = 1
# What runs the network: the SavedModel, or its ONNX models (`export --format onnx|all`).
RUNTIMES = ("tensorflow", "onnxruntime")
ROUTE = re.compile(r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?(?P<action>:predict|/metadata)?$")


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
    pixels: int = 0  # the images' decoded pixels, from their headers

    def __len__(self):
        return len(self.values)


class ModelServer:
    """The highest version of one exported model, and TF Serving's REST semantics over it.

    Args:
        directory: the model's folder, `saved_models/<name>`.
        max_batch: the most instances one request may hold.
        runtime: "tensorflow" (the SavedModel) or "onnxruntime" (the ONNX models of
            `export --format onnx|all`, as `OnnxRuntimeSignature`s with the same signatures).
    """

    def __init__(self, directory, max_batch=DEFAULT_MAX_BATCH, runtime="tensorflow"):
        if not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive integer. Received: max_batch={max_batch!r}")
        if runtime not in RUNTIMES:
            raise ValueError(f"runtime must be one of {list(RUNTIMES)}. Received: runtime={runtime!r}")
        self.name = served_name(directory)
        self.path = export.latest_version(directory, "onnx" if runtime == "onnxruntime" else "saved_model")
        self.version = int(os.path.basename(self.path))
        self.max_batch, self.runtime = max_batch, runtime
        self.metadata = export.read_metadata(self.path)
        if runtime == "onnxruntime":
            self.signatures = onnx_signatures(self.path, self.metadata)
            return
        try:
            self.loaded = tf.saved_model.load(self.path)
        except Exception as error:  # noqa: BLE001  (a damaged saved_model.pb or variables: DecodeError, OpError, ...)
            raise ValueError(f"Could not load the SavedModel {self.path} (a truncated or corrupt saved_model.pb or "
                             f"variables/: export it again): {type(error).__name__}: {str(error)[:300]}") from error
        self.signatures = dict(self.loaded.signatures)
        check_class_names(self.signatures, self.metadata, os.path.join(self.path, contract.METADATA_FILE))

    @functools.cached_property
    def max_separators(self):
        """The most commas a request of `max_batch` instances holds, for its largest signature:
        each instance's numbers and nested arrays (or its one string), and a few fields.
        Counted in the body's bytes before it is parsed, this bounds the values JSON makes."""
        def per_instance(spec):
            sizes = [size for size in spec.shape.as_list()[1:]]
            return sum(int(np.prod(sizes[:end])) for end in range(1, len(sizes) + 1)) or 1

        largest = max(per_instance(spec) for function in self.signatures.values()
                      for spec in function.structured_input_signature[1].values())
        return self.max_batch * largest + REQUEST_FIELDS_SLACK

    def status(self):
        return {"model_version_status": [
            {"version": str(self.version), "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
        ]}

    def describe(self):
        signature_def = {}
        for name, function in self.signatures.items():
            inputs = {key: tensor_info(spec) for key, spec in function.structured_input_signature[1].items()}
            outputs = {key: tensor_info(spec) for key, spec in function.structured_outputs.items()}
            signature_def[name] = {"inputs": inputs, "outputs": outputs, "method_name": "tensorflow/serving/predict"}
        return {"model_spec": {"name": self.name, "signature_name": "", "version": str(self.version)},
                "metadata": {"signature_def": {"signature_def": signature_def}, "keras_preact": self.metadata}}

    def check_version(self, version):
        # Compared as text: a 5,000-digit version is no int Python parses by default.
        if version is not None and version.lstrip("0") != str(self.version):
            raise BadRequest(f"Servable not found for request: Specific({self.name}, {version}); this server "
                             f"serves version {self.version}.", status=404)

    def predict(self, body):
        """The response to a `:predict` request body (bytes), as a JSON-ready dict, unbatched."""
        parsed = self.parse(body)
        return self.respond(parsed, self.infer([parsed])[0])

    def parse(self, body):
        """A `:predict` request body (bytes) read into a `Parsed`.

        Raises:
            BadRequest: for malformed JSON, an unknown signature, a missing, mistyped or
                misshapen input, too large a batch, or images too large or not images.
        """
        separators = count_separators(body, self.max_separators)
        if separators > self.max_separators:
            raise BadRequest(f"The request holds too many values: {separators + 1:,} or more, where {self.max_batch} "
                             f"instances (--max-batch) of this model's largest input hold at most "
                             f"{self.max_separators:,}.", 413)
        try:
            request = json.loads(body)
        except (UnicodeDecodeError, ValueError) as error:  # ValueError: JSON errors, numbers of over 4,300 digits
            raise BadRequest(f"The request body is not valid JSON: {str(error)[:200]}") from None
        except RecursionError:
            raise BadRequest("The request body is nested too deeply to read.") from None
        if not isinstance(request, dict):
            raise BadRequest(f"The request must be a JSON object. Received: {type(request).__name__}")
        name = request.get("signature_name", "serving_default")
        if not isinstance(name, str) or name not in self.signatures:
            raise BadRequest(f"Unknown signature_name. Choose one of {sorted(self.signatures)}. "
                             f"Received: {json.dumps(name)[:80]}")
        unknown = sorted(set(request) - {"signature_name", "instances", "inputs"})
        if unknown or ("instances" in request) == ("inputs" in request):
            raise BadRequest("The request needs exactly one of 'instances' (row format) or 'inputs' (columnar), "
                             f"and optionally 'signature_name'. Received keys: {sorted(request)}")
        (key, spec), = self.signatures[name].structured_input_signature[1].items()
        row_format = "instances" in request
        values = request["instances"] if row_format else request["inputs"]
        if row_format and isinstance(values, list):
            values = [value[key] if isinstance(value, dict) and key in value else value for value in values]
        elif not row_format and isinstance(values, dict) and key in values:
            values = values[key]
        values = to_values(values, spec, key, self.max_batch)
        values, pixels = checked_images(values, key) if spec.dtype == tf.string else (values, 0)
        return Parsed(name, key, values, row_format, pixels)

    def infer(self, requests):
        """The outputs (numpy arrays by name) of each of `requests` (Parsed, one signature), or
        the BadRequest that request gets, from one call of the network over all of them."""
        if len(requests) > 1:
            try:
                outputs = self.call(requests[0].signature, requests[0].key, concatenated(requests))
            except BadRequest:  # one request's images do not decode: each alone says whose
                return [self.infer([request])[0] for request in requests]
            ends = np.cumsum([len(request) for request in requests])
            return [{output: value[end - len(request):end] for output, value in outputs.items()}
                    for request, end in zip(requests, ends)]
        try:
            return [self.call(requests[0].signature, requests[0].key, requests[0].values)]
        except BadRequest as error:
            return [error]

    def call(self, signature, key, values):
        function = self.signatures[signature]
        tensor = tf.constant(values)
        try:
            outputs = function(**{key: tensor})
        except tf.errors.InvalidArgumentError as error:
            raise BadRequest(undecodable(tensor) if tensor.dtype == tf.string else first_line(error)) from None
        return {output: np.asarray(value) for output, value in outputs.items()}

    def respond(self, parsed, outputs):
        """The JSON-ready answer to `parsed` from its `outputs`; non-finite outputs are a BadRequest."""
        if isinstance(outputs, BadRequest):
            raise outputs
        broken = sorted({int(row) for value in outputs.values() if value.dtype.kind == "f"
                         for row in np.nonzero(~np.isfinite(value.reshape(len(value), -1)).all(axis=1))[0]})
        if broken:
            raise BadRequest(f"The network's outputs are not finite (NaN or infinite) for instances {broken[:10]}: "
                             "inputs far outside the range it was trained on.")
        outputs = {output: to_json(value) for output, value in outputs.items()}
        if not parsed.row_format:
            return {"outputs": outputs}
        return {"predictions": [dict(zip(outputs, row)) for row in zip(*outputs.values())]}


def served_name(directory):
    """The name a model folder is served by: its base name, which must be one URL path
    segment (`export.MODEL_NAME`: no ":" or "/", which the routes use).

    Raises:
        ValueError: for a folder whose name no URL of TF Serving's API can reach.
    """
    name = os.path.basename(os.path.normpath(directory))
    if not export.MODEL_NAME.fullmatch(name):
        raise ValueError(f"The model folder's name {name!r} cannot be served: TF Serving's URLs "
                         "(/v1/models/<name>:predict) need a name of letters, digits, '_', '-' and '.', not starting "
                         f"with '.'. Rename the folder. Received: {directory!r}")
    return name


def check_class_names(signatures, metadata, metadata_path):
    """Raises a ValueError naming `metadata_path` where its class names are missing or do not
    match the number of classes the network's logits have."""
    names = metadata.get("class_names")
    if not isinstance(names, list) or not names or not all(isinstance(name, str) for name in names):
        raise ValueError(f"{metadata_path} has no list of class names ('class_names'): export the model again. "
                         f"Received: class_names={json.dumps(names)[:80]}")
    for name, function in signatures.items():
        classes = function.structured_outputs["logits"].shape[-1]
        if classes != len(names):
            raise ValueError(f"{metadata_path} names {len(names)} classes, but the signature {name!r} has {classes} "
                             "logits: the metadata belongs to another model. Export the model again.")


class OnnxRuntimeSignature:
    """A signature of the SavedModel computed with onnxruntime: what `ModelServer` reads of
    a concrete function (`structured_input_signature`, `structured_outputs`, a call with
    the input by name), the same inputs, outputs and preprocessing.

    Encoded images are decoded and resized with the SavedModel's own function
    (`export.Preprocessing.decode`, TensorFlow eagerly), normalised as its
    Normalization layer does and run through `predict_normalized.onnx`; the top-k class
    names and scores come from the probabilities (ties to the lower class id, as
    `tf.math.top_k`) and metadata.json's class names.
    """

    def __init__(self, session, key, spec, preprocessing, class_names, top_k):
        self.session, self.key = session, key
        normalization = preprocessing.normalization()

        # Traced once: eagerly, tf.map_fn and the layer cost more than the network.
        @tf.function(input_signature=[tf.TensorSpec((None,), tf.string)])
        def decoded(images):
            pixels = tf.map_fn(preprocessing.decode, images, fn_output_signature=tf.TensorSpec(preprocessing.shape))
            return normalization(pixels)

        self.decoded = decoded
        self.class_names, self.top_k = np.array([name.encode() for name in class_names], dtype=object), top_k
        self.structured_input_signature = ((), {key: spec})
        classes = len(class_names)
        self.structured_outputs = {
            "logits": tf.TensorSpec((None, classes), tf.float32, "logits"),
            "probabilities": tf.TensorSpec((None, classes), tf.float32, "probabilities"),
            "class_ids": tf.TensorSpec((None,), tf.int64, "class_ids"),
            "classes": tf.TensorSpec((None, top_k), tf.string, "classes"),
            "scores": tf.TensorSpec((None, top_k), tf.float32, "scores")}

    def __call__(self, **inputs):
        values = inputs[self.key]
        if self.key == "images":
            values = self.decoded(values)
        names = [output.name for output in self.session.get_outputs()]
        outputs = dict(zip(names, self.session.run(names, {self.session.get_inputs()[0].name: np.asarray(values)})))
        ranked = np.argsort(-outputs["probabilities"], axis=-1, kind="stable")[:, :self.top_k]
        return dict(outputs, classes=self.class_names[ranked],
                    scores=np.take_along_axis(outputs["probabilities"], ranked, -1))


def onnx_signatures(path, metadata):
    """The three signatures over a version folder's ONNX models, on as many threads as the
    machine has cores (onnxruntime's default), each file checked first: its SHA-256 against
    the one metadata.json recorded at export, then its input and outputs against the
    signature's and the class names.

    Raises:
        ValueError: naming the file, for a missing, empty, truncated, altered or swapped
            ONNX model, or metadata.json without what the models need.
    """
    try:
        import onnxruntime
    except ImportError:
        raise ImportError(f"--runtime onnxruntime needs the onnx extra: {export.ONNX_EXTRA}") from None
    metadata_path = os.path.join(path, contract.METADATA_FILE)
    try:
        preprocessing = export.Preprocessing(**{field: value for field, value in metadata["input"].items()
                                                if field != "pixel_range"})
        files, digests = metadata["onnx"]["files"], metadata["onnx"].get("sha256", {})
        class_names, top_k = metadata["class_names"], metadata["top_k"]
        missing = sorted(set(contract.ONNX_MODELS) - set(files))
        if missing:
            raise KeyError(f"onnx.files.{missing[0]}")
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{metadata_path} does not describe the ONNX models ({type(error).__name__}: {error}): "
                         "export the model again with --format onnx (or all).") from None
    sessions = {}
    for signature in contract.ONNX_MODELS:
        file = os.path.join(path, files[signature])
        if signature in digests and os.path.isfile(file) and pretrained.sha256(file) != digests[signature]:
            raise ValueError(f"The ONNX model {file} is not the one exported with {metadata_path}: its SHA-256 "
                             f"differs from the recorded {digests[signature][:16]}... (replaced, truncated or "
                             "altered). Export the model again.")
        try:
            session = onnxruntime.InferenceSession(file, providers=["CPUExecutionProvider"])
        except Exception as error:  # noqa: BLE001  (onnxruntime reports a missing or damaged file as many kinds)
            reason = " ".join(str(error).split())[:200]
            raise ValueError(f"Could not load the ONNX model {file} (missing, empty, truncated or corrupt: export "
                             f"it again): {type(error).__name__}: {reason}") from None
        check_onnx_session(session, file, contract.SIGNATURES[signature], preprocessing.shape, len(class_names))
        sessions[signature] = session
    if not digests:
        warnings.warn(f"{metadata_path} records no SHA-256 of the ONNX models (exported by an older keras-preact): "
                      "they were checked by their inputs and outputs only.", stacklevel=2)
    return {name: OnnxRuntimeSignature(sessions[signature.onnx_model], signature.key,
                                       export.input_spec(signature, preprocessing.shape), preprocessing, class_names,
                                       top_k)
            for name, signature in contract.SIGNATURES.items()}


def check_onnx_session(session, file, signature, image_shape, classes):
    """Raises a ValueError naming `file` where its model is not the signature's: another input
    (the two files swapped), another image shape, or other outputs or classes (another model)."""
    def dimensions(tensor):  # a named dynamic dimension ('unk__181', 'batch') as None
        return [size if isinstance(size, int) else None for size in tensor.shape]

    inputs, outputs = session.get_inputs(), {output.name: output for output in session.get_outputs()}
    received = [(tensor.name, tensor.type, dimensions(tensor)) for tensor in inputs]
    expected = [(signature.key, contract.ONNX_TYPES[signature.dtype], list(signature.shape(image_shape)))]
    if received != expected:
        raise ValueError(f"The ONNX model {file} takes {received}, where its signature takes {expected}: the file "
                         "belongs to another signature or model. Export the model again.")
    logits = outputs.get("logits")
    if sorted(outputs) != sorted(contract.ONNX_OUTPUTS) or logits is None or logits.shape[-1] != classes:
        found = {name: dimensions(outputs[name]) for name in sorted(outputs)}
        raise ValueError(f"The ONNX model {file} answers {found}, where metadata.json's {classes} classes need "
                         f"{list(contract.ONNX_OUTPUTS)} with {classes} logits: the file belongs to another model. "
                         "Export the model again.")


def concatenated(requests):
    if isinstance(requests[0].values, list):
        return [image for request in requests for image in request.values]
    return np.concatenate([request.values for request in requests])


def to_values(values, spec, key, max_batch):
    """The JSON value of input `key` as a numpy array of `spec`'s dtype (a list of bytes for
    encoded images), or a BadRequest that says why not."""
    if not isinstance(values, list) or not values:
        raise BadRequest(f"Input {key!r} must be a non-empty list, one entry per instance. "
                         f"Received: {type(values).__name__}")
    if len(values) > max_batch:
        raise BadRequest(f"Too many instances: this server takes at most {max_batch} per request "
                         f"(--max-batch). Received: {len(values)}")
    if spec.dtype == tf.string:
        return [binary(value, key, index) for index, value in enumerate(values)]
    try:
        array = np.asarray(values, dtype=np.float64)
    except (ValueError, TypeError):
        raise BadRequest(f"Input {key!r} must be a rectangular array of numbers of shape {shape_text(spec)}.") from None
    expected = spec.shape.as_list()
    if array.ndim != len(expected) or any(want is not None and want != got for want, got in zip(expected, array.shape)):
        raise BadRequest(f"Input {key!r} must have shape {shape_text(spec)}. Received: shape "
                         f"{tuple(array.shape)}")
    if spec.dtype == tf.uint8 and (np.any(array < 0) or np.any(array > 255) or np.any(array != np.round(array))):
        raise BadRequest(f"Input {key!r} holds uint8 pixels: integers from 0 to 255.")
    if not np.all(np.isfinite(array)):
        raise BadRequest(f"Input {key!r} holds a NaN or infinite value.")
    with np.errstate(over="ignore"):
        converted = array.astype(spec.dtype.as_numpy_dtype)
    if not np.all(np.isfinite(converted)):
        raise BadRequest(f"Input {key!r} holds a value too large for {spec.dtype.name} "
                         f"(at most {np.finfo(spec.dtype.as_numpy_dtype).max:.4g}).")
    return converted


def binary(value, key, index):
    if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except ValueError as error:
            raise BadRequest(f"Instance {index} of {key!r}: invalid base64 ({error}).") from None
    if isinstance(value, str):
        return value.encode()
    raise BadRequest(f"Instance {index} of {key!r} must be {{\"b64\": \"<base64 of the image file>\"}}. "
                     f"Received: {json.dumps(value)[:80]}")


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


def checked_images(images, key):
    """The encoded `images` as the network decodes them, and their pixels, read from their
    headers (Pillow reads a header without decoding the image): a BadRequest for files that
    are not JPEG, PNG, GIF or BMP, for an image over MAX_IMAGE_PIXELS and for a request over
    MAX_REQUEST_PIXELS. A GIF (`FIRST_FRAME_ONLY`) is replaced by its first frame as PNG,
    decoded here once its size is known to fit, so that no later frame is ever decoded."""
    total, checked = 0, []
    for index, encoded in enumerate(images):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # refused below, by our own bound
                with Image.open(io.BytesIO(encoded), formats=IMAGE_FORMATS) as image:
                    width, height = image.size
                    if width * height <= MAX_IMAGE_PIXELS and image.format in FIRST_FRAME_ONLY:
                        encoded = first_frame_png(image)
        except Image.DecompressionBombError as error:  # over 179 million pixels: refused by Pillow itself
            raise BadRequest(f"Instance {index} of {key!r} is too large: {error}", 413) from None
        except Image.UnidentifiedImageError:
            raise BadRequest(f"{UNDECODABLE}instance {index} ({len(encoded)} bytes): Unknown image file "
                             "format") from None
        except (OSError, ValueError, SyntaxError, EOFError) as error:  # a header or frame Pillow cannot read
            raise BadRequest(f"{UNDECODABLE}instance {index} ({len(encoded)} bytes): "
                             f"{(str(error).splitlines() or [type(error).__name__])[0][:120]}") from None
        if width * height > MAX_IMAGE_PIXELS:
            raise BadRequest(f"Instance {index} of {key!r} is too large: {width} x {height} pixels; this server "
                             f"decodes at most {MAX_IMAGE_PIXELS:,} pixels an image.", 413)
        total += width * height
        checked.append(encoded)
    if total > MAX_REQUEST_PIXELS:
        raise BadRequest(f"The request's images are too large together: {total:,} pixels; this server decodes "
                         f"at most {MAX_REQUEST_PIXELS:,} pixels a request.", 413)
    return checked, total


def first_frame_png(image):
    """The first frame of an opened GIF as PNG bytes, with TensorFlow's GIF decoder's pixels:
    RGB from the palette, transparent pixels black (0, 0, 0)."""
    image.seek(0)
    rgba = np.asarray(image.convert("RGBA"))
    rgb = np.where(rgba[..., 3:] > 0, rgba[..., :3], 0).astype(np.uint8)
    encoded = io.BytesIO()
    Image.fromarray(rgb, "RGB").save(encoded, format="PNG", compress_level=1)
    return encoded.getvalue()


def undecodable(images):
    """The message for a batch of encoded images that failed: which ones, and why."""
    failures = []
    for index, encoded in enumerate(images):
        try:
            tf.io.decode_image(encoded, expand_animations=False)
        except tf.errors.InvalidArgumentError as error:
            failures.append(f"instance {index} ({len(encoded.numpy())} bytes): {first_line(error)}")
    if not failures:
        return "The images could not be processed."
    return UNDECODABLE + "; ".join(failures)


def first_line(error):
    """TensorFlow's message without its graph and op decorations."""
    message = str(getattr(error, "message", error)).strip().splitlines()[0]
    return re.sub(r"\{\{.*?\}\}\s*|\s*\[Op:.*$", "", message)


def shape_text(spec):
    return "[" + ", ".join("batch" if size is None else str(size) for size in spec.shape.as_list()) + "]"


def tensor_info(spec):
    return {"dtype": spec.dtype.name, "tensor_shape": [-1 if size is None else size for size in spec.shape.as_list()],
            "name": spec.name}


def to_json(array):
    if array.dtype == object:
        return np.vectorize(lambda value: value.decode("utf-8", "replace"), otypes=[object])(array).tolist()
    return array.tolist()


class Batcher:
    """Runs the network for `Parsed` requests on `threads` threads, off the event loop.

    With `batching`, the requests of one signature that wait while every thread is busy
    go to the network together, up to `max_batch` instances and MAX_REQUEST_PIXELS
    (TF Serving's request batching): a lone request waits for nothing, and under load
    one call serves many requests. Runs on the event loop's thread only.
    """

    def __init__(self, model, threads=INFERENCE_THREADS, batching=True):
        self.model, self.batching = model, batching
        self.pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="inference")
        self.idle_threads = threads
        self.waiting = collections.deque()  # (Parsed, future)
        self.running = set()  # the event loop keeps only weak references to its tasks

    async def infer(self, parsed):
        """The outputs of the network for `parsed`, or the BadRequest it gets."""
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((parsed, future))
        self.dispatch()
        return await future

    def dispatch(self):
        """Starts a call on every idle thread while requests wait. Where assembling a batch
        fails, the first waiting request runs alone: a request that cannot be run is
        answered with its error (a 500) by `run`, and every slot comes back."""
        while self.waiting and self.idle_threads:
            try:
                batch = self.next_batch()
            except Exception:  # noqa: BLE001  (nothing left the queue: no request or slot is lost)
                batch = [self.waiting.popleft()]
            self.idle_threads -= 1
            task = asyncio.ensure_future(self.run(batch))
            self.running.add(task)
            task.add_done_callback(self.running.discard)

    def next_batch(self):
        """The first waiting request and, with batching, every later one of its signature that
        fits within max_batch instances and MAX_REQUEST_PIXELS. Chosen by position before the
        queue changes: if choosing fails, nothing has left the queue."""
        waiting = list(self.waiting)
        chosen = [0]
        if self.batching:
            first = waiting[0][0]
            instances, pixels = len(first), first.pixels
            for index, (parsed, _) in enumerate(waiting[1:], start=1):
                if (parsed.signature == first.signature and instances + len(parsed) <= self.model.max_batch
                        and pixels + parsed.pixels <= MAX_REQUEST_PIXELS):
                    chosen.append(index)
                    instances, pixels = instances + len(parsed), pixels + parsed.pixels
        taken = set(chosen)
        self.waiting = collections.deque(entry for index, entry in enumerate(waiting) if index not in taken)
        return [waiting[index] for index in chosen]

    async def run(self, batch):
        try:
            results = await asyncio.get_running_loop().run_in_executor(
                self.pool, self.model.infer, [parsed for parsed, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"The network answered {len(results)} of the batch's {len(batch)} requests.")
            for (_, future), result in zip(batch, results):
                if not future.done():
                    future.set_result(result)
        except Exception as error:  # noqa: BLE001  (answered as a 500 by each request of the batch)
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
        finally:
            self.idle_threads += 1
            self.dispatch()


class Disconnected(Exception):
    """The client went away before its request was read whole."""


class Application:
    """TF Serving's REST API over a ModelServer, as an ASGI application.

    Args:
        model: the ModelServer.
        max_in_flight: the most `:predict` requests parsed, queued or running at once;
            past it a request is answered 503 with Retry-After as soon as its body is read.
            (Requests still arriving are bounded by the request timeout and MAX_CONNECTIONS.)
        batching: whether requests waiting together are run as one batch.
    """

    def __init__(self, model, max_in_flight=DEFAULT_MAX_IN_FLIGHT, batching=True):
        self.model, self.max_in_flight = model, max_in_flight
        self.batcher = Batcher(model, batching=batching)
        self.parsing = concurrent.futures.ThreadPoolExecutor(PARSE_THREADS, thread_name_prefix="parse")
        self.in_flight = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":  # uvicorn runs it with lifespan="off": nothing else arrives
            return
        request = {"body_read": scope["method"] in ("GET", "HEAD")
                   and not any(name in (b"content-length", b"transfer-encoding") for name, _ in scope["headers"])}
        headers = []
        try:
            status, response = 200, await self.answer(scope, receive, request)
        except BadRequest as error:
            status, response = error.status, {"error": str(error)}
            if status == 503:
                headers.append((b"retry-after", str(RETRY_AFTER_SECONDS).encode()))
            if status == 405:
                headers.append((b"allow", error.allowed))
        except Disconnected:
            return
        except Exception as error:  # noqa: BLE001  (the server keeps serving whatever one request does)
            status, response = 500, {"error": f"{type(error).__name__}: {first_line(error)}"}
        if not request["body_read"] or status in (414, 431, 505):
            # Unread bytes are never read as a request, and a client that sends heads past
            # the bound is not heard again.
            headers.append((b"connection", b"close"))
        body = json.dumps(response).encode()
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]})
        await send({"type": "http.response.body", "body": body})

    async def answer(self, scope, receive, request):
        # h11 bounds a head that arrives in pieces (Protocol.send_400_response); one that
        # arrives at once is bounded here.
        if len(scope["raw_path"]) + len(scope["query_string"]) > MAX_HEAD_BYTES:
            raise BadRequest(f"The request line is too long: at most {MAX_HEAD_BYTES} bytes.", 414)
        if sum(len(name) + len(value) + 4 for name, value in scope["headers"]) > MAX_HEAD_BYTES:
            raise BadRequest(f"The request's headers are too large: at most {MAX_HEAD_BYTES} bytes.", 431)
        if scope["http_version"] not in ("1.0", "1.1"):
            raise BadRequest(f"HTTP/{scope['http_version'][:10]} is not supported: this server speaks HTTP/1.1.", 505)
        if {b"content-length", b"transfer-encoding"} <= {name for name, _ in scope["headers"]}:
            # RFC 9112, section 6.1: a request framed both ways may be a smuggling attempt;
            # it is refused, and its connection closed (its body is never read).
            raise BadRequest("The request has both Content-Length and Transfer-Encoding: send one of them.")
        route = ROUTE.match(scope["path"])
        model = self.model
        if not route or route["name"] != model.name:
            raise BadRequest(f"No such resource: {scope['method']} {scope['path'][:200]}. This server serves "
                             f"/v1/models/{model.name} (GET), .../metadata (GET) and ...:predict (POST).", 404)
        allowed = "POST" if route["action"] == ":predict" else "GET"
        if scope["method"] != allowed:
            error = BadRequest(f"Method {scope['method']} is not allowed for {scope['path'][:200]}: use {allowed}.",
                               405)
            error.allowed = allowed.encode()
            raise error
        model.check_version(route["version"])
        if route["action"] == "/metadata":
            return model.describe()
        if route["action"] is None:
            return model.status()
        body = await read_body(scope, receive)
        request["body_read"] = True
        if self.in_flight >= self.max_in_flight:
            raise BadRequest(f"The server is busy: {self.max_in_flight} requests are in flight (--max-in-flight). "
                             f"Retry after {RETRY_AFTER_SECONDS} s.", 503)
        self.in_flight += 1
        try:
            loop = asyncio.get_running_loop()
            parsed = await loop.run_in_executor(self.parsing, model.parse, body)  # up to 64 MiB: off the loop
            del body
            outputs = await self.batcher.infer(parsed)
            return await loop.run_in_executor(self.parsing, model.respond, parsed, outputs)
        finally:
            self.in_flight -= 1


async def read_body(scope, receive):
    """The request body, refused with a 413 as soon as it passes MAX_BODY_BYTES (h11 has
    already checked its framing: a valid Content-Length or chunked encoding)."""
    length = dict(scope["headers"]).get(b"content-length")
    if length is not None and int(length) > MAX_BODY_BYTES:
        raise BadRequest(f"The request body is too large: at most {MAX_BODY_BYTES} bytes. Received: "
                         f"{length.decode()[:20]}", 413)
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Disconnected()
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > MAX_BODY_BYTES:
            raise BadRequest(f"The request body is too large: at most {MAX_BODY_BYTES} bytes.", 413)
        if not message.get("more_body", False):
            return b"".join(chunks)


def error_response(status, message, close=True):
    """TF Serving's JSON error as raw HTTP/1.1 bytes, for the protocol's own answers."""
    body = json.dumps({"error": message}).encode()
    head = (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n")
    if status == 503:
        head += f"retry-after: {RETRY_AFTER_SECONDS}\r\n"
    return (head + ("connection: close\r\n" if close else "") + "\r\n").encode() + body


class Protocol(H11Protocol):
    """uvicorn's h11 protocol with what it lacks against hostile clients.

    - Each request must arrive whole (headers and body) within `request_timeout` seconds
      of its connection opening or of the previous response: otherwise 408 and the
      connection closed (a client that trickles bytes holds nothing for long).
    - At most MAX_CONNECTIONS connections: past it, 503 and closed at once.
    - Malformed HTTP is TF Serving's JSON error: 400, 414 (a request line past
      MAX_HEAD_BYTES) or 431 (headers past it), instead of uvicorn's plain text.
    """

    def __init__(self, *arguments, request_timeout=DEFAULT_REQUEST_TIMEOUT, **keywords):
        super().__init__(*arguments, **keywords)
        self.request_timeout = request_timeout
        self.deadline = None

    def connection_made(self, transport):
        super().connection_made(transport)
        if len(self.connections) > MAX_CONNECTIONS:
            self.refuse(503, f"The server is busy: {MAX_CONNECTIONS} connections are open. "
                             f"Retry after {RETRY_AFTER_SECONDS} s.")
            return
        self.start_deadline()

    def connection_lost(self, exc):
        if self.deadline is not None:
            self.deadline.cancel()
        super().connection_lost(exc)

    def on_response_complete(self):
        super().on_response_complete()
        self.start_deadline()

    def eof_received(self):
        """A client that half-closes after a whole request is answered, then closed; one that
        half-closes in the middle of a request has left (asyncio then closes the transport)."""
        if self.cycle is not None and not self.cycle.response_complete and self.conn.their_state is h11.DONE:
            self.cycle.keep_alive = False
            return True
        return None

    def start_deadline(self):
        if self.deadline is not None:
            self.deadline.cancel()
        self.deadline = self.loop.call_later(self.request_timeout, self.deadline_passed)

    def deadline_passed(self):
        if self.conn.their_state is h11.DONE or self.transport.is_closing():
            return  # the request arrived whole; the network is answering it
        if self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]:
            self.transport.close()  # an idle connection: nothing to answer
            return
        self.refuse(408, f"The request did not arrive whole within {self.request_timeout:g} s "
                         "(--request-timeout).")

    def send_400_response(self, msg):
        received = self.conn.trailing_data[0]
        if len(received) >= MAX_HEAD_BYTES and b"\r\n" not in received:
            self.refuse(414, f"The request line is too long: at most {MAX_HEAD_BYTES} bytes with the headers.")
        elif len(received) >= MAX_HEAD_BYTES:
            self.refuse(431, f"The request's headers are too large: at most {MAX_HEAD_BYTES} bytes.")
        else:
            self.refuse(400, "Invalid HTTP request: it does not follow HTTP/1.1 (RFC 9112), for example a "
                             "malformed request line or header, or a Content-Length that is not a number of bytes.")

    def refuse(self, status, message):
        """Answers `status` and closes; an application still reading the body is told the client left."""
        self.transport.write(error_response(status, message))
        self.transport.close()


def serve(directory, host="127.0.0.1", port=DEFAULT_PORT, max_batch=DEFAULT_MAX_BATCH, verbose=False,
          max_in_flight=DEFAULT_MAX_IN_FLIGHT, request_timeout=DEFAULT_REQUEST_TIMEOUT, batching=True, runtime="auto"):
    """Serves the highest version of `directory` until interrupted (Ctrl-C or SIGTERM).

    `runtime` "auto" serves with onnxruntime where the highest version has ONNX models
    and onnxruntime is installed (faster: see docs/serving.md), with TensorFlow otherwise."""
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an integer from 0 (any free port) to 65535. Received: port={port!r}")
    if not isinstance(max_in_flight, int) or max_in_flight < 1:
        raise ValueError(f"max_in_flight must be a positive integer. Received: max_in_flight={max_in_flight!r}")
    if not isinstance(request_timeout, (int, float)) or not 0 < request_timeout < float("inf"):
        raise ValueError(f"request_timeout must be a positive number of seconds. "
                         f"Received: request_timeout={request_timeout!r}")
    model = auto_model(directory, max_batch) if runtime == "auto" else ModelServer(directory, max_batch, runtime)
    listening = listening_socket(host, port)  # clients queue from here on, while uvicorn starts
    config = uvicorn.Config(
        Application(model, max_in_flight, batching), http=functools.partial(Protocol, request_timeout=request_timeout),
        backlog=LISTEN_BACKLOG, timeout_keep_alive=KEEP_ALIVE_SECONDS, h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        lifespan="off", loop="asyncio", proxy_headers=False, server_header=False,
        log_level="info" if verbose else "error", access_log=verbose, timeout_graceful_shutdown=5)
    print(f"Serving {model.name} version {model.version} ({model.path}, {model.runtime}) at "
          f"http://{host}:{listening.getsockname()[1]}/v1/models/{model.name}", flush=True)
    uvicorn.Server(config).run(sockets=[listening])


def listening_socket(host, port):
    """A TCP socket listening on host:port with LISTEN_BACKLOG. Created with IPPROTO_TCP:
    asyncio sets TCP_NODELAY on the connections it accepts only from a socket whose
    protocol says TCP, and without it Nagle's algorithm holds every kept-alive response
    after the first for a delayed ACK (about 40 ms)."""
    listening = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM,
                              socket.IPPROTO_TCP)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host, port))
    except OSError as error:
        listening.close()
        raise ValueError(f"Cannot listen on {host}:{port}: {error.strerror or error} (is another server using "
                         f"the port? choose another with --port). Received: port={port}") from error
    listening.listen(LISTEN_BACKLOG)
    return listening


def auto_model(directory, max_batch=DEFAULT_MAX_BATCH):
    """The ModelServer of `runtime="auto"`: onnxruntime where the highest version has ONNX
    models and onnxruntime is installed; TensorFlow otherwise, and (with a warning that
    says why) where the ONNX models cannot be served."""
    if onnx_servable(directory):
        try:
            return ModelServer(directory, max_batch, "onnxruntime")
        except (ValueError, FileNotFoundError, ImportError) as error:
            print(f"warning: serving the SavedModel with TensorFlow instead of the ONNX models: {error}",
                  file=sys.stderr, flush=True)
    return ModelServer(directory, max_batch, "tensorflow")


def onnx_servable(directory):
    """Whether the highest version of `directory` has ONNX models and onnxruntime is installed."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    newest = max(export.versions(directory), default=None)
    return newest is not None and os.path.exists(os.path.join(directory, str(newest), contract.ONNX_DIRECTORY))
