"""`keras-preact serve`: an exported model over TF Serving's REST API."""

import os
import sys

from .. import export, serving

HELP = "serve an exported model over TF Serving's REST API"
DESCRIPTION = (
    "Serve the highest version of a model folder at /v1/models/<name> with TF Serving's REST "
    'API (GET status and metadata, POST :predict with instances or inputs, images as {"b64": ...}); '
    "--verbose also logs every request."
)
# TensorFlow only where the runtime chosen is TensorFlow's (`run`): the onnxruntime one never imports it.
TENSORFLOW = "never"
BACKENDS = None


def add_arguments(parser):
    parser.add_argument("model_dir", help="the model's folder, e.g. saved_models/digits_resnet20")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument(
        "--port",
        type=int,
        default=serving.DEFAULT_PORT,
        help=f"port (default: {serving.DEFAULT_PORT}, TF Serving's REST port)",
    )
    parser.add_argument(
        "--max-batch",
        type=int,
        default=serving.DEFAULT_MAX_BATCH,
        help=f"most instances per request (default: {serving.DEFAULT_MAX_BATCH})",
    )
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=serving.DEFAULT_MAX_IN_FLIGHT,
        help="most prediction requests parsed, queued or running at once; past it, 503 with "
        f"Retry-After (default: {serving.DEFAULT_MAX_IN_FLIGHT})",
    )
    parser.add_argument(
        "--max-body-memory",
        type=int,
        default=serving.DEFAULT_MAX_BODY_MEMORY,
        help="most mebibytes of prediction request bodies held at once, each counted as it arrives; "
        f"past it, 503 with Retry-After (default: {serving.DEFAULT_MAX_BODY_MEMORY})",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=serving.DEFAULT_REQUEST_TIMEOUT,
        help="seconds a connection may stay idle or take to send a request's head (past them it is "
        "closed), then seconds the request's body has to arrive (past them, 408 and the connection closed) "
        f"(default: {serving.DEFAULT_REQUEST_TIMEOUT:g})",
    )
    parser.add_argument(
        "--runtime",
        choices=("auto", "tensorflow", "onnxruntime"),
        default="auto",
        help="what runs the network: the SavedModel on TensorFlow, or the ONNX models of "
        "`export --format onnx|all` on onnxruntime (default auto: onnxruntime where the "
        "highest version has them and the onnx extra is installed)",
    )
    parser.add_argument(
        "--precision",
        choices=export.FORMATS["onnx"].precisions,
        default="float32",
        help="the ONNX models to serve: float32 (default), or int8 (`export --quantize int8`; onnxruntime only)",
    )
    parser.add_argument(
        "--no-batching",
        dest="batching",
        action="store_false",
        help="run every request alone (by default, requests that wait while the network is "
        "busy run together as one batch)",
    )


def check(arguments):
    """The options, the model's folder and the port, checked before TensorFlow loads (a second,
    not eight): a folder with a complete version for some runtime, and an address to listen on."""
    from ..export import contract
    from ..serving import server

    server.check_options(arguments.port, arguments.max_in_flight, arguments.max_body_memory, arguments.request_timeout)

    missing = []
    for served in server.runtime_formats().values():
        try:
            contract.latest_version(arguments.model_dir, served.name, "float32")
        except FileNotFoundError as error:
            missing.append(error)
    if len(missing) == len(server.runtime_formats()):
        raise missing[0]  # the SavedModel's, the default format
    server.listening_socket(arguments.host, arguments.port).close()


def run(arguments):
    from ..serving import server
    from ..tensorflow_import import import_tensorflow

    if not server.serves_onnx(arguments.model_dir, arguments.runtime, arguments.precision):
        # TensorFlow's own choice of kernels: on a processor with AVX2 alone, oneDNN's, which it
        # leaves off there, gave an input that overflows the network (normalized values of 3e38)
        # finite outputs, where TensorFlow's own kernels and onnxruntime give NaN (a 400).
        import_tensorflow(arguments.verbose, onednn=False)
    server.serve(
        arguments.model_dir,
        arguments.host,
        arguments.port,
        arguments.max_batch,
        arguments.verbose,
        arguments.max_in_flight,
        arguments.request_timeout,
        arguments.batching,
        arguments.runtime,
        arguments.precision,
        arguments.max_body_memory,
    )
    # Stopped: every request under way was answered (or told 503 past the grace) and every
    # connection closed. A thread still decoding an image whose request was answered, and
    # TensorFlow's teardown, would hold the exit for seconds: the process ends now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
