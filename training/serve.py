"""A local server that speaks TF Serving's REST API, and a client for it.

    python -m training serve saved_models/<name> [--port 8501]
    python -m training query --model <name> image.jpg ...   (training.client)

The server (this module) loads the highest version of a model folder, as TF Serving does, and answers

    GET  /v1/models/<name>[/versions/<version>]            the model's status
    GET  /v1/models/<name>[/versions/<version>]/metadata   its signatures and metadata.json
    POST /v1/models/<name>[/versions/<version>]:predict    predictions

with the request and response bodies of TF Serving's REST API
(https://www.tensorflow.org/tfx/serving/api_rest): `{"signature_name": ..., "instances":
[...]}` (row format, answered with "predictions") or `{"inputs": ...}` (columnar,
answered with "outputs"); binary values such as encoded images as `{"b64": "..."}`. A
client written for TF Serving works against it unchanged. Bad requests get HTTP 400 and
`{"error": "..."}` and the server goes on serving; requests are served concurrently, each
in its own thread. It is a small server for local use and tests: production serves the
same folder with TF Serving itself (see the README).
"""

import base64
import http.server
import json
import os
import re

import numpy as np
import tensorflow as tf

from training import export
from training.defaults import DEFAULT_MAX_BATCH, DEFAULT_PORT

# The largest request body read: 64 encoded 224 x 224 JPEGs take about 2 MB.
MAX_BODY_BYTES = 64 * 2**20
# Connections waiting to be accepted (the standard library's default is 5, which reset
# clients at 32 concurrent connections).
LISTEN_BACKLOG = 1024
ROUTE = re.compile(r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?(?P<action>:predict|/metadata)?$")


class BadRequest(ValueError):
    """A request the server cannot answer; `status` is its HTTP status."""

    def __init__(self, message, status=400):
        super().__init__(message)
        self.status = status


class ModelServer:
    """The highest version of one exported model, and TF Serving's REST semantics over it.

    Args:
        directory: the model's folder, `saved_models/<name>`.
        max_batch: the most instances one request may hold.
    """

    def __init__(self, directory, max_batch=DEFAULT_MAX_BATCH):
        if not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive integer. Received: max_batch={max_batch!r}")
        self.path = export.latest_version(directory)
        self.name = os.path.basename(os.path.normpath(directory))
        self.version = int(os.path.basename(self.path))
        self.max_batch = max_batch
        self.metadata = export.read_metadata(self.path)
        try:
            self.loaded = tf.saved_model.load(self.path)
        except Exception as error:  # noqa: BLE001  (a damaged saved_model.pb or variables: DecodeError, OpError, ...)
            raise ValueError(f"Could not load the SavedModel {self.path} (a truncated or corrupt saved_model.pb or "
                             f"variables/: export it again): {type(error).__name__}: {str(error)[:300]}") from error
        self.signatures = dict(self.loaded.signatures)

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
        """The response to a `:predict` request body (bytes), as a JSON-ready dict.

        Raises:
            BadRequest: for malformed JSON, an unknown signature, a missing, mistyped or
                misshapen input, too large a batch, or undecodable images.
        """
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
        function = self.signatures[name]
        (key, spec), = function.structured_input_signature[1].items()
        row_format = "instances" in request
        values = request["instances"] if row_format else request["inputs"]
        if row_format and isinstance(values, list):
            values = [value[key] if isinstance(value, dict) and key in value else value for value in values]
        elif not row_format and isinstance(values, dict) and key in values:
            values = values[key]
        tensor = to_tensor(values, spec, key, self.max_batch)
        try:
            outputs = function(**{key: tensor})
        except tf.errors.InvalidArgumentError as error:
            raise BadRequest(undecodable(tensor) if spec.dtype == tf.string else first_line(error)) from None
        outputs = {output: value.numpy() for output, value in outputs.items()}
        broken = sorted({int(row) for value in outputs.values() if value.dtype.kind == "f"
                         for row in np.nonzero(~np.isfinite(value.reshape(len(value), -1)).all(axis=1))[0]})
        if broken:
            raise BadRequest(f"The network's outputs are not finite (NaN or infinite) for instances {broken[:10]}: "
                             "inputs far outside the range it was trained on.")
        outputs = {output: to_json(value) for output, value in outputs.items()}
        if not row_format:
            return {"outputs": outputs}
        return {"predictions": [dict(zip(outputs, row)) for row in zip(*outputs.values())]}


def to_tensor(values, spec, key, max_batch):
    """The JSON value of input `key` as a tensor of `spec`, or a BadRequest that says why not."""
    if not isinstance(values, list) or not values:
        raise BadRequest(f"Input {key!r} must be a non-empty list, one entry per instance. "
                         f"Received: {type(values).__name__}")
    if len(values) > max_batch:
        raise BadRequest(f"Too many instances: this server takes at most {max_batch} per request "
                         f"(--max-batch). Received: {len(values)}")
    if spec.dtype == tf.string:
        return tf.constant([binary(value, key, index) for index, value in enumerate(values)])
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
    return tf.constant(converted)


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
    return "Could not decode the image bytes (JPEG, PNG, GIF or BMP expected): " + "; ".join(failures)


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


class Handler(http.server.BaseHTTPRequestHandler):
    server_version = "keras-preact-serving"
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.answer(lambda route: (self.server.model.describe() if route["action"] == "/metadata"
                                   else self.server.model.status()), action=(None, "/metadata"))

    def do_POST(self):
        def predict(route):
            return self.server.model.predict(self.read_body())

        self.answer(predict, action=(":predict",))

    def read_body(self):
        """The request body, read exactly as long as its Content-Length says; anything else
        (chunked encoding, a missing, negative or too large length) is refused."""
        if "Transfer-Encoding" in self.headers:
            raise BadRequest("Chunked or other transfer encodings are not accepted: send the body with a "
                             f"Content-Length. Received: Transfer-Encoding: {self.headers['Transfer-Encoding']}", 411)
        text = self.headers.get("Content-Length")
        if text is None or not text.isdigit():
            raise BadRequest(f"A request body needs a Content-Length of 0 or more bytes. Received: {text!r}"[:200],
                             status=411 if text is None else 400)
        # Compared by its digits first: a length of thousands of digits is no int to parse.
        if len(text.lstrip("0")) > len(str(MAX_BODY_BYTES)) or int(text) > MAX_BODY_BYTES:
            raise BadRequest(f"The request body is too large: at most {MAX_BODY_BYTES} bytes. Received: {text[:20]}",
                             413)
        body = self.rfile.read(int(text))
        self.body_read = True
        return body

    def answer(self, respond, action):
        # A request whose body is not read whole is answered, then its connection closed: the
        # unread bytes must never be parsed as the next request.
        self.body_read = self.command == "GET" and "Content-Length" not in self.headers \
            and "Transfer-Encoding" not in self.headers
        try:
            route = ROUTE.match(self.path.split("?")[0])
            model = self.server.model
            if not route or route["name"] != model.name or route["action"] not in action:
                raise BadRequest(f"No such resource: {self.command} {self.path}. This server serves "
                                 f"/v1/models/{model.name} (GET), .../metadata (GET) and ...:predict (POST).", 404)
            model.check_version(route["version"])
            status, response = 200, respond(route)
        except BadRequest as error:
            status, response = error.status, {"error": str(error)}
        except Exception as error:  # the server keeps serving whatever one request does
            status, response = 500, {"error": f"{type(error).__name__}: {first_line(error)}"}
        body = json.dumps(response).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if not self.body_read:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *arguments):
        if self.server.verbose:
            super().log_message(format, *arguments)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, model, host, port, verbose=False):
        super().__init__((host, port), Handler)
        self.model, self.verbose = model, verbose


def serve(directory, host="127.0.0.1", port=DEFAULT_PORT, max_batch=DEFAULT_MAX_BATCH, verbose=False):
    """Serves the highest version of `directory` until interrupted."""
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an integer from 0 (any free port) to 65535. Received: port={port!r}")
    model = ModelServer(directory, max_batch)
    try:
        server = Server(model, host, port, verbose)
    except OSError as error:
        raise ValueError(f"Cannot listen on {host}:{port}: {error.strerror or error} (is another server using "
                         f"the port? choose another with --port). Received: port={port}") from error
    print(f"Serving {model.name} version {model.version} ({model.path}) at "
          f"http://{host}:{server.server_port}/v1/models/{model.name}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
