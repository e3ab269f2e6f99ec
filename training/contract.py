"""The contract of an exported model, defined once: export writes it, serving reads and
checks it, and neither restates it. Importable without TensorFlow.

An exported version folder (`<name>/<version>/`, TF Serving's layout) holds a SavedModel
with three signatures over one network, optionally the two ONNX models that compute them
under onnxruntime, and `metadata.json`:

    serving_default      images: string [batch]                 encoded JPEG/PNG/GIF/BMP bytes
    predict_pixels       pixels: uint8 [batch, H, W, C]          raw pixels, 0-255
    predict_normalized   normalized: float32 [batch, H, W, C]    the network's own input

Every signature answers `OUTPUTS`; an ONNX model answers `ONNX_OUTPUTS` (the class names
are in metadata.json: ONNX runtimes handle strings unevenly), and encoded images reach
`predict_normalized.onnx` once decoded and normalised.
"""

import dataclasses
import os


@dataclasses.dataclass(frozen=True)
class Signature:
    """One signature of an exported model.

    Attributes:
        name: the signature's name, as TF Serving's requests give it (`signature_name`).
        key: the name of its one input.
        dtype: the input's dtype: "string" (encoded images, a vector over the batch),
            "uint8" or "float32" (images, [batch, height, width, channels]).
        onnx_model: the signature whose ONNX model computes it under onnxruntime.
        holds: what the input holds, after its dtype and shape.
    """

    name: str
    key: str
    dtype: str
    onnx_model: str
    holds: str

    def shape(self, image_shape):
        """The input's shape, None for the batch, for a network of `image_shape` (H, W, C)."""
        return (None,) if self.dtype == "string" else (None, *image_shape)

    def describe(self, image_shape):
        """E.g. "pixels: tf.uint8 [batch, 32, 32, 3], 0-255" (metadata.json's description)."""
        dimensions = ", ".join(["batch", *map(str, self.shape(image_shape)[1:])])
        return f"{self.key}: tf.{self.dtype} [{dimensions}], {self.holds}"


SIGNATURES = {signature.name: signature for signature in (
    Signature("serving_default", "images", "string", "predict_normalized",
              "encoded JPEG/PNG/GIF/BMP images of any size"),
    Signature("predict_pixels", "pixels", "uint8", "predict_pixels", "0-255"),
    Signature("predict_normalized", "normalized", "float32", "predict_normalized",
              "(pixels - normalization_mean) / normalization_std"),
)}
OUTPUTS = ("logits", "probabilities", "class_ids", "classes", "scores")
METADATA_FILE = "metadata.json"
# The ONNX models: one per signature whose input is an image array (an ONNX graph has no
# optional inputs), under <version>/onnx/, answering the numeric outputs.
ONNX_DIRECTORY = "onnx"
ONNX_MODELS = tuple(name for name, signature in SIGNATURES.items() if signature.onnx_model == name)
ONNX_OUTPUTS = ("logits", "probabilities", "class_ids")
# onnxruntime's names of the ONNX models' input types.
ONNX_TYPES = {"uint8": "tensor(uint8)", "float32": "tensor(float)"}


def onnx_file(name):
    """The ONNX model of signature `name`, relative to its version folder."""
    return os.path.join(ONNX_DIRECTORY, f"{name}.onnx")
