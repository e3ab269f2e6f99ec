"""The SavedModel's three signatures computed with onnxruntime, without TensorFlow or Keras.

Encoded images are decoded, brought to the network's size and normalised with Pillow and
NumPy (`images.preprocess`, the SavedModel's own preprocessing), then run through
`predict_normalized.onnx`; pixels run through `predict_pixels.onnx`. The top-k class
names and scores come from the probabilities (ties to the lower class id, as
`tf.math.top_k`) and metadata.json's class names.
"""

import json
import os
import warnings

import numpy as np

from keras_preact.checksums import sha256

from ..data import images
from ..export import contract, onnx_models
from .protocol import UNDECODABLE, BadRequest


class OnnxRuntime:
    """A version folder's ONNX models in one precision, each file checked first: its SHA-256
    against the one metadata.json recorded at export, then its input and outputs against the
    signature's and the class names. Runs on as many threads as the machine has cores
    (onnxruntime's default).

    Args:
        path: the version folder (`saved_models/<name>/<version>`).
        metadata: its metadata.json, as read.
        preprocessing: the `contract.Preprocessing` it records.
        class_names, top_k: the classes the outputs name, and how many each answer lists.
        precision: "float32", or "int8" (the models `export --quantize int8` writes beside them).

    Raises:
        ValueError: naming the file, for a missing, empty, truncated, altered or swapped
            ONNX model, or metadata.json without what the models need.
        ImportError: where onnxruntime is not installed.
    """

    def __init__(self, path, metadata, preprocessing, class_names, top_k, precision="float32"):
        try:
            import onnxruntime
        except ImportError:
            raise ImportError(f"--runtime onnxruntime needs the onnx extra: {onnx_models.EXTRA}") from None
        metadata_path = os.path.join(path, contract.METADATA_FILE)
        self.name = "onnxruntime" if precision == "float32" else f"onnxruntime, {precision}"
        try:
            described = contract.onnx_models(metadata, precision)
            files, digests = described["files"], described.get("sha256", {})
            missing = sorted(set(contract.ONNX_MODELS) - set(files))
            if missing:
                raise KeyError(f"onnx.files.{missing[0]}")
        except (KeyError, TypeError, AttributeError) as error:
            raise ValueError(
                f"{metadata_path} does not describe the {precision} ONNX models ({type(error).__name__}: {error}): "
                "export the model again with --format onnx (or all)"
                + (f" --quantize {precision} --calibration-images ..." if precision != "float32" else "")
                + "."
            ) from None
        if precision == "int8" and described.get("settings") != contract.ONNX_INT8_SETTINGS:
            raise ValueError(
                f"The int8 ONNX models of {path} were quantized with other settings than "
                f"{contract.ONNX_INT8_SETTINGS} (8-bit weights with unsigned activations overflow on processors "
                "without VNNI): export the model again with `keras-preact export ... --format onnx --quantize int8 "
                "--calibration-images ...`."
            )
        if precision == "int8" and "input_ranges" not in described:
            raise ValueError(
                f"The int8 ONNX models of {path} record no range of the inputs they quantize (exported before "
                "serve checked them): export the model again with `keras-preact export ... --format onnx "
                "--quantize int8 --calibration-images ...`."
            )
        # The float inputs an int8 model takes, by signature: those it quantizes without saturating,
        # widened to what any pixel normalizes to (an image's extremes the calibration images lacked
        # saturate a little, as they do through serving_default).
        self.input_ranges = {}
        if precision != "float32":
            pixels = [
                ((0 - mean) / std, (255 - mean) / std)
                for mean, std in zip(preprocessing.normalization_mean, preprocessing.normalization_std)
            ]
            self.input_ranges = {
                signature: (min(lowest, *(low for low, _ in pixels)), max(highest, *(high for _, high in pixels)))
                for signature, (lowest, highest) in described["input_ranges"].items()
            }
        self.sessions = {}
        for signature in contract.ONNX_MODELS:
            file = os.path.join(path, files[signature])
            if not os.path.isfile(file):  # missing, or a FIFO that reading would wait on
                raise ValueError(f"The ONNX model {file} is missing or not a regular file: export the model again.")
            if signature in digests and sha256(file) != digests[signature]:
                raise ValueError(
                    f"The ONNX model {file} is not the one exported with {metadata_path}: its SHA-256 "
                    f"differs from the recorded {digests[signature][:16]}... (replaced, truncated or "
                    "altered). Export the model again."
                )
            try:
                session = onnxruntime.InferenceSession(file, providers=["CPUExecutionProvider"])
            except Exception as error:
                reason = " ".join(str(error).split())[:200]
                raise ValueError(
                    f"Could not load the ONNX model {file} (missing, empty, truncated or corrupt: "
                    f"export it again): {type(error).__name__}: {reason}"
                ) from None
            check_session(session, file, contract.SIGNATURES[signature], preprocessing.shape, len(class_names))
            check_answer(session, file, metadata, metadata_path)
            self.sessions[signature] = session
        if not digests:
            warnings.warn(
                f"{metadata_path} records no SHA-256 of the ONNX models (exported by an older "
                "keras-preact): they were checked by their inputs and outputs only.",
                stacklevel=2,
            )
        self.preprocessing, self.top_k = preprocessing, top_k
        self.class_names = np.array([name.encode() for name in class_names], dtype=object)

    def __call__(self, signature, values):
        """The outputs (numpy arrays by name) of `signature` for `values`.

        Raises:
            BadRequest: for encoded images that do not decode, and for values an int8 model would
                saturate (outside the range it was calibrated on).
        """
        if signature in self.input_ranges:
            check_range(values, *self.input_ranges[signature])
        signature = contract.SIGNATURES[signature]
        if signature.dtype == "string":
            try:
                values = images.preprocess(values, self.preprocessing)
            except ValueError as error:
                raise BadRequest(f"{UNDECODABLE}{error}") from None
        session = self.sessions[signature.onnx_model]
        outputs = dict(
            zip(
                contract.ONNX_OUTPUTS,
                session.run(list(contract.ONNX_OUTPUTS), {session.get_inputs()[0].name: np.asarray(values)}),
            )
        )
        ranked = np.argsort(-outputs["probabilities"], axis=-1, kind="stable")[:, : self.top_k]
        return dict(
            outputs, classes=self.class_names[ranked], scores=np.take_along_axis(outputs["probabilities"], ranked, -1)
        )


def check_range(values, lowest, highest):
    """A BadRequest for values outside [lowest, highest]: an int8 model would answer for them as
    if they were at the range's edge (quantization saturates), where float32 answers for them, as
    it refuses non-finite values (`protocol.parse`)."""
    values = np.asarray(values)
    low, high = float(values.min()), float(values.max())
    if low < lowest or high > highest:
        raise BadRequest(
            f"The inputs hold values from {low:.6g} to {high:.6g}, outside {lowest:.6g} to {highest:.6g}, the range "
            "the int8 model takes (calibrated, or of normalized pixels): it would answer as if they were at its edge. Send values "
            "normalized as the pixels of images are, or serve the float32 models (without --precision int8)."
        )


def check_answer(session, file, metadata, metadata_path):
    """Raises a ValueError naming the fields where metadata.json's class names, input or top_k
    (`contract.ANSWER_FIELDS`) are not those the ONNX model `file` was exported with; a model
    exported before the models recorded them is served with a warning."""
    recorded = session.get_modelmeta().custom_metadata_map.get(contract.ONNX_ANSWER_KEY)
    if recorded is None:
        warnings.warn(
            f"The ONNX model {file} records no class names, input or top_k (exported by an older "
            f"keras-preact): {metadata_path}'s are served unchecked.",
            stacklevel=3,
        )
        return
    try:
        exported = json.loads(recorded)
    except ValueError:
        exported = {}
    served = json.loads(contract.answer_fields(metadata))
    edited = [field for field in contract.ANSWER_FIELDS if served[field] != exported.get(field)]
    if edited:
        said = "; ".join(
            f"{field}={json.dumps(served[field])[:200]} where the model has {json.dumps(exported.get(field))[:200]}"
            for field in edited
        )
        raise ValueError(
            f"{metadata_path} is not the one exported with the ONNX model {file} (edited, or another "
            f"export's): it says {said}. Export the model again."
        )


def check_session(session, file, signature, image_shape, classes):
    """Raises a ValueError naming `file` where its model is not the signature's: another input
    (the two files swapped), another image shape, or other outputs or classes (another model)."""

    def dimensions(tensor):  # a named dynamic dimension ('unk__181', 'batch') as None
        return [size if isinstance(size, int) else None for size in tensor.shape]

    inputs, outputs = session.get_inputs(), {output.name: output for output in session.get_outputs()}
    received = [(tensor.name, tensor.type, dimensions(tensor)) for tensor in inputs]
    expected = [(signature.key, contract.ONNX_TYPES[signature.dtype], list(signature.shape(image_shape)))]
    if received != expected:
        raise ValueError(
            f"The ONNX model {file} takes {received}, where its signature takes {expected}: the file "
            "belongs to another signature or model. Export the model again."
        )
    logits = outputs.get("logits")
    if sorted(outputs) != sorted(contract.ONNX_OUTPUTS) or logits is None or logits.shape[-1] != classes:
        found = {name: dimensions(outputs[name]) for name in sorted(outputs)}
        raise ValueError(
            f"The ONNX model {file} answers {found}, where metadata.json's {classes} classes need "
            f"{list(contract.ONNX_OUTPUTS)} with {classes} logits: the file belongs to another model. "
            "Export the model again."
        )
