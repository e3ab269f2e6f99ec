"""The SavedModel's own signatures, on TensorFlow: the runtime TF Serving would use."""

import os
import re

import numpy as np
import tensorflow as tf

from ..export import contract
from .protocol import UNDECODABLE, BadRequest


class TensorFlowRuntime:
    """A version folder's SavedModel, its signatures checked against the contract.

    Args:
        path: the version folder (`saved_models/<name>/<version>`).
        metadata: its metadata.json, as read (unused here: every runtime takes the same arguments).
        preprocessing: the `contract.Preprocessing` it records.
        class_names, top_k: the classes the outputs name, and how many each answer lists.
        precision: "float32", the SavedModel's only one (`ModelServer` checks it).

    Raises:
        ValueError: for a SavedModel that does not load, or whose signatures are not the
            contract's (`contract.SIGNATURES`, `contract.output_shapes`).
    """

    name = "tensorflow"

    def __init__(self, path, metadata, preprocessing, class_names, top_k, precision="float32"):
        try:
            self.loaded = tf.saved_model.load(path)
        except Exception as error:
            raise ValueError(
                f"Could not load the SavedModel {path} (a truncated or corrupt saved_model.pb or "
                f"variables/: export it again): {type(error).__name__}: {str(error)[:300]}"
            ) from error
        self.functions = dict(self.loaded.signatures)
        check_signatures(self.functions, path, preprocessing.shape, len(class_names), top_k)

    def __call__(self, signature, values):
        """The outputs (numpy arrays by name) of `signature` for `values`.

        Raises:
            BadRequest: for encoded images that do not decode, or inputs the graph refuses.
        """
        tensor = tf.constant(values)
        try:
            outputs = self.functions[signature](**{contract.SIGNATURES[signature].key: tensor})
        except tf.errors.InvalidArgumentError as error:
            raise BadRequest(undecodable(tensor) if tensor.dtype == tf.string else first_line(error)) from None
        return {output: np.asarray(value) for output, value in outputs.items()}


def check_signatures(functions, path, image_shape, classes, top_k):
    """Raises a ValueError naming `path` where the SavedModel's signatures are not the
    contract's: names, inputs (key, dtype, shape) or outputs (dtype, shape)."""
    outputs = contract.output_shapes(classes, top_k)
    for name, signature in contract.SIGNATURES.items():
        function = functions.get(name)
        if function is None:
            raise ValueError(
                f"The SavedModel {path} has no signature {name!r} (it has {sorted(functions)}): "
                "export it again with keras-preact."
            )
        logits = function.structured_outputs["logits"].shape[-1] if "logits" in function.structured_outputs else None
        if logits != classes:
            raise ValueError(
                f"{os.path.join(path, contract.METADATA_FILE)} names {classes} classes, but the signature "
                f"{name!r} has {logits} logits: the metadata belongs to another model. Export the model "
                "again."
            )
        received = {
            key: (spec.dtype.name, tuple(spec.shape.as_list()))
            for key, spec in function.structured_input_signature[1].items()
        }
        received_outputs = {
            key: (spec.dtype.name, tuple(spec.shape.as_list())) for key, spec in function.structured_outputs.items()
        }
        expected = {signature.key: (signature.dtype, signature.shape(image_shape))}
        if received != expected or received_outputs != outputs:
            raise ValueError(
                f"The SavedModel {path}'s signature {name!r} takes {received} and answers "
                f"{received_outputs}, where metadata.json's model takes {expected} and answers "
                f"{outputs}: the metadata belongs to another model. Export the model again."
            )


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
