"""`keras-preact query`: image files sent to a TF Serving REST endpoint, its top-k classes printed."""

from .. import export, serving

HELP = "send image files to a TF Serving REST endpoint, print top-k classes"
DESCRIPTION = (
    "Send image files (JPEG, PNG, GIF, BMP) to a model served by `keras-preact serve` or TF Serving, through "
    "its REST API (POST /v1/models/<model>:predict, the images base64-encoded), and print each image's top-k "
    "classes with their probabilities. Needs neither TensorFlow nor Keras."
)
TENSORFLOW = "never"
BACKENDS = None


def add_arguments(parser):
    parser.add_argument("images", nargs="+", help="image files (JPEG, PNG, GIF, BMP)")
    parser.add_argument("--model", required=True, help="the served model's name")
    server = f"http://127.0.0.1:{serving.DEFAULT_PORT}"
    parser.add_argument("--server", default=server, help=f"default: {server}")
    parser.add_argument(
        "--top-k",
        type=int,
        default=export.DEFAULT_TOP_K,
        help=f"classes to print per image (default: {export.DEFAULT_TOP_K})",
    )


def run(arguments):
    from ..serving import client

    predictions = client.query(arguments.server, arguments.model, arguments.images, top_k=arguments.top_k)
    client.print_predictions(arguments.images, predictions)
    return 0
