"""A client of TF Serving's REST API (and of `keras-preact serve`): standard library only.

keras-preact query --model cifar10_resnet20 docs/cifar10/cat_0000.jpg --top-k 3
"""

import base64
import json
import os
import sys
import urllib.error
import urllib.request


def query(server, model, paths, signature="serving_default", top_k=None, timeout=60):
    """Sends image files to a TF Serving REST endpoint; returns one prediction per file.

    Raises:
        FileNotFoundError: for an image file that does not exist (or is a folder).
        OSError: for an image file that cannot be read.
        ValueError: with the server's message, for a request it refused.
        ConnectionError: if no server answers at `server`.
    """
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer. Received: top_k={top_k!r}")
    instances = []
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"No image file {path!r}.")
        with open(path, "rb") as file:
            instances.append({"b64": base64.b64encode(file.read()).decode("ascii")})
    body = json.dumps({"signature_name": signature, "instances": instances}).encode()
    url = f"{server.rstrip('/')}/v1/models/{model}:predict"
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            predictions = answer(url, response.status, response.read()).get("predictions")
    except urllib.error.HTTPError as error:
        raise ValueError(f"{url} answered {error.code}: {answer(url, error.code, error.read()).get('error')}") from None
    except urllib.error.URLError as error:
        raise ConnectionError(
            f"No server answers at {url}: {error.reason}. Start one with `keras-preact serve saved_models/{model}`."
        ) from None
    if (
        not isinstance(predictions, list)
        or len(predictions) != len(paths)
        or not all(
            isinstance(prediction, dict) and {"classes", "scores"} <= set(prediction) for prediction in predictions
        )
    ):
        raise ValueError(
            f"{url} answered without a prediction (classes and scores) for each of the {len(paths)} "
            "images: is it TF Serving's REST API with a keras-preact model?"
        )
    for prediction in predictions:
        prediction["classes"] = prediction["classes"][:top_k]
        prediction["scores"] = prediction["scores"][:top_k]
    return predictions


def answer(url, status, body):
    """A server's JSON answer as a dict, or a ValueError that shows what it sent instead."""
    try:
        value = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        value = None
    if not isinstance(value, dict):
        shown = body[:120].decode("utf-8", "replace")
        raise ValueError(
            f"{url} answered {status} with a body that is not a JSON object, so it is not TF Serving's "
            f"REST API (is --server right?). Received: {shown!r}{'...' if len(body) > 120 else ''}"
        )
    return value


def print_predictions(paths, predictions, file=sys.stdout):
    for path, prediction in zip(paths, predictions):
        ranked = ", ".join(f"{name} {score:.1%}" for name, score in zip(prediction["classes"], prediction["scores"]))
        print(f"{path}: {ranked}", file=file)
