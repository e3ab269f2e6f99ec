"""The highest version of one exported model, and TF Serving's REST semantics over it."""

import importlib
import json
import os

import numpy as np

from ..export import FORMATS, contract
from . import DEFAULT_MAX_BATCH, protocol
from .protocol import BadRequest

# What runs the network: the SavedModel on TensorFlow, or its ONNX models on onnxruntime
# (`export --format onnx|all`), each imported only when chosen: the onnxruntime server
# never imports TensorFlow or Keras.
RUNTIMES = {"tensorflow": "tensorflow_runtime:TensorFlowRuntime", "onnxruntime": "onnx_runtime:OnnxRuntime"}


class ModelServer:
    """The highest version of one exported model, and TF Serving's REST semantics over it.

    Args:
        directory: the model's folder, `saved_models/<name>`.
        max_batch: the most instances one request may hold.
        runtime: "tensorflow" (the SavedModel) or "onnxruntime" (the ONNX models of
            `export --format onnx|all`); both answer the same signatures (`contract`).
        precision: the ONNX models served, "float32" or "int8" (`export --quantize int8`);
            the SavedModel is float32 only.
    """

    def __init__(self, directory, max_batch=DEFAULT_MAX_BATCH, runtime="tensorflow", precision="float32"):
        if not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive integer. Received: max_batch={max_batch!r}")
        if runtime not in RUNTIMES:
            raise ValueError(f"runtime must be one of {list(RUNTIMES)}. Received: runtime={runtime!r}")
        served = runtime_formats()
        offered = served[runtime].precisions
        if precision not in offered:
            elsewhere = [format for format in served.values() if precision in format.precisions]
            raise ValueError(
                f"The {runtime} runtime serves {' and '.join(offered)} models ({precision} {elsewhere[0].files_name} "
                f"are served by --runtime {elsewhere[0].runtime}). Received: precision={precision!r}"
                if elsewhere
                else f"precision must be one of {sorted({p for f in served.values() for p in f.precisions})}. "
                f"Received: precision={precision!r}"
            )
        self.name = served_name(directory)
        self.path = contract.latest_version(directory, served[runtime].name, precision)
        self.version = int(os.path.basename(self.path))
        self.max_batch = max_batch
        self.metadata = contract.read_metadata(self.path)
        metadata_path = os.path.join(self.path, contract.METADATA_FILE)
        self.class_names = checked_class_names(self.metadata, metadata_path)
        try:
            self.preprocessing = contract.Preprocessing.from_metadata(self.metadata)
            self.image_pixels = self.preprocessing.image_size**2  # of one image at the network's size
            self.top_k = int(self.metadata["top_k"])
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(
                f"{metadata_path} does not describe the model's input and top_k "
                f"({type(error).__name__}: {error}): export the model again."
            ) from None
        module, name = RUNTIMES[runtime].split(":")
        # By name: the onnxruntime runtime's server never imports the TensorFlow runtime's module.
        runtime_class = getattr(importlib.import_module(f"{__package__}.{module}"), name)
        self.runtime = runtime_class(
            self.path, self.metadata, self.preprocessing, self.class_names, self.top_k, precision
        )

    def status(self):
        """TF Serving's status answer, and beside it (a field TF Serving's clients pass over)
        which runtime serves the version: "tensorflow", "onnxruntime" or "onnxruntime, int8"."""
        return {
            "model_version_status": [
                {
                    "version": str(self.version),
                    "state": "AVAILABLE",
                    "status": {"error_code": "OK", "error_message": ""},
                }
            ],
            "runtime": self.runtime.name,
        }

    def describe(self):
        """TF Serving's metadata answer: every signature's inputs and outputs, and metadata.json."""
        outputs = {
            name: tensor_info(name, dtype, shape)
            for name, (dtype, shape) in contract.output_shapes(len(self.class_names), self.top_k).items()
        }
        signature_def = {
            name: {
                "inputs": {
                    signature.key: tensor_info(
                        signature.key, signature.dtype, signature.shape(self.preprocessing.shape)
                    )
                },
                "outputs": outputs,
                "method_name": "tensorflow/serving/predict",
            }
            for name, signature in contract.SIGNATURES.items()
        }
        return {
            "model_spec": {"name": self.name, "signature_name": "", "version": str(self.version)},
            "metadata": {"signature_def": {"signature_def": signature_def}, "keras_preact": self.metadata},
        }

    def check_version(self, version):
        # Compared as text: a 5,000-digit version is no int Python parses by default.
        if version is not None and version.lstrip("0") != str(self.version):
            raise BadRequest(
                f"Servable not found for request: Specific({self.name}, {version}); this server "
                f"serves version {self.version}.",
                status=404,
            )

    def parse(self, body):
        """A `:predict` request body (bytes) read into a `protocol.Parsed` (or a BadRequest), its
        images checked but for what only a trial decode finds (`check_decoding`)."""
        return protocol.parse(body, contract.SIGNATURES, self.preprocessing.shape, self.max_batch)

    def check_decoding(self, parsed):
        """A BadRequest where a trial decode finds an image of `parsed` the runtimes would decode
        differently (`protocol.check_decoding`)."""
        protocol.check_decoding(parsed, self.preprocessing.shape[-1])

    def predict(self, body):
        """The response to a `:predict` request body (bytes), as a JSON-ready dict, unbatched."""
        parsed = self.parse(body)
        self.check_decoding(parsed)
        return protocol.answer(parsed, self.infer([parsed])[0])

    def infer(self, batch):
        """The outputs (numpy arrays by name) of each `protocol.Parsed` of `batch` (one
        signature), or the BadRequest that request gets, from one call of the network."""
        if len(batch) > 1:
            try:
                outputs = self.runtime(batch[0].signature, protocol.concatenated(batch))
            except BadRequest:  # one request's images do not decode: each alone says whose
                return [self.infer([parsed])[0] for parsed in batch]
            ends = np.cumsum([len(parsed) for parsed in batch])
            return [
                {output: value[end - len(parsed) : end] for output, value in outputs.items()}
                for parsed, end in zip(batch, ends)
            ]
        try:
            return [self.runtime(batch[0].signature, batch[0].values)]
        except BadRequest as error:
            return [error]


def runtime_formats():
    """{runtime: the format it serves} (`export.FORMATS`' runtimes)."""
    return {format.runtime: format for format in FORMATS.values() if format.runtime}


def served_name(directory):
    """The name a model folder is served by: its base name, which must be one URL path
    segment (`contract.MODEL_NAME`: no ":" or "/", which the routes use).

    Raises:
        ValueError: for a folder whose name no URL of TF Serving's API can reach.
    """
    name = os.path.basename(os.path.normpath(directory))
    if not contract.MODEL_NAME.fullmatch(name):
        raise ValueError(
            f"The model folder's name {name!r} cannot be served: TF Serving's URLs "
            "(/v1/models/<name>:predict) need a name of letters, digits, '_', '-' and '.', not starting "
            f"with '.'. Rename the folder. Received: {directory!r}"
        )
    return name


def checked_class_names(metadata, metadata_path):
    """metadata.json's class names, or a ValueError naming `metadata_path` where they are missing."""
    names = metadata.get("class_names")
    if not isinstance(names, list) or not names or not all(isinstance(name, str) for name in names):
        raise ValueError(
            f"{metadata_path} has no list of class names ('class_names'): export the model again. "
            f"Received: class_names={json.dumps(names)[:80]}"
        )
    return names


def tensor_info(name, dtype, shape):
    return {"dtype": dtype, "tensor_shape": [-1 if size is None else size for size in shape], "name": name}
