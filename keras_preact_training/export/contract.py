"""The contract of an exported model, defined once: export writes it, serving reads and
checks it, and neither restates it. Importable without TensorFlow.

An exported version folder (`<name>/<version>/`, TF Serving's layout) holds a SavedModel
with three signatures over one network, optionally the two ONNX models that compute them
under onnxruntime (in float32, and in int8 beside them), optionally LiteRT models of
`predict_pixels` (in float32, float16 and int8), and `metadata.json`:

    serving_default      images: string [batch]                 encoded JPEG/PNG/GIF/BMP bytes
    predict_pixels       pixels: uint8 [batch, H, W, C]          raw pixels, 0-255
    predict_normalized   normalized: float32 [batch, H, W, C]    the network's own input

Every signature answers `OUTPUTS`; an ONNX model answers `ONNX_OUTPUTS` (the class names
are in metadata.json: ONNX runtimes handle strings unevenly), and encoded images reach
`predict_normalized.onnx` once decoded and normalised. A LiteRT model takes `predict_pixels`'
pixels and answers `probabilities` only, as phones and microcontrollers use it.
"""

import dataclasses
import json
import os
import re

from keras_preact import checksums

from .. import checked_files
from ..data import images


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


SIGNATURES = {
    signature.name: signature
    for signature in (
        Signature(
            "serving_default", "images", "string", "predict_normalized", "encoded JPEG/PNG/GIF/BMP images of any size"
        ),
        Signature("predict_pixels", "pixels", "uint8", "predict_pixels", "0-255"),
        Signature(
            "predict_normalized",
            "normalized",
            "float32",
            "predict_normalized",
            "(pixels - normalization_mean) / normalization_std",
        ),
    )
}
OUTPUTS = ("logits", "probabilities", "class_ids", "classes", "scores")
METADATA_FILE = "metadata.json"
# The ONNX models: one per signature whose input is an image array (an ONNX graph has no
# optional inputs), under <version>/onnx/, answering the numeric outputs.
ONNX_DIRECTORY = "onnx"
ONNX_MODELS = tuple(name for name, signature in SIGNATURES.items() if signature.onnx_model == name)
ONNX_OUTPUTS = ("logits", "probabilities", "class_ids")
# onnxruntime's names of the ONNX models' input types.
ONNX_TYPES = {"uint8": "tensor(uint8)", "float32": "tensor(float)"}
# The fields of metadata.json that an ONNX runtime's answers depend on beyond the models: the
# class names it answers, how an encoded image becomes the network's input, and the length of
# each answer's ranking. Every ONNX model records them as exported (JSON, under
# ONNX_ANSWER_KEY in its metadata_props), so that an edited metadata.json is refused, not
# served; the SavedModel holds all of them in its graph.
ANSWER_FIELDS = ("class_names", "input", "top_k")
ONNX_ANSWER_KEY = "keras_preact.answer"


# How the int8 ONNX models are quantized, as metadata.json records it: onnxruntime's QDQ format,
# uint8 activations, and int8 weights per output channel in onnxruntime's reduced range
# (`reduce_range`, -64 to 64). On x86-64 processors without VNNI onnxruntime multiplies uint8
# by int8 through an instruction that adds two products into 16 bits, which full-range weights
# overflow (255 x 127 x 2 > 32,767; onnxruntime's quantization guide, "When and why do I need
# to try U8U8?") and reduced-range ones cannot (255 x 64 x 2 = 32,640). Signed activations
# (S8S8) cannot overflow either, but ran the zoo's networks 1.2-3.4 times slower on a VNNI
# processor at the same errors, within 0.25 points either way (docs/benchmarks.md, "Which
# processor"). A version whose int8 models record other settings is not served.
ONNX_INT8_SETTINGS = {
    "format": "QDQ",
    "weights": "int8 from -64 to 64 (onnxruntime's reduced range), per output channel",
    "activations": "uint8",
}
# The LiteRT models: `predict_pixels` in each precision, under <version>/litert/.
LITERT_DIRECTORY = "litert"
LITERT_SIGNATURE = "predict_pixels"
LITERT_OUTPUT = "probabilities"


def answer_fields(metadata):
    """The JSON text of metadata.json's ANSWER_FIELDS (keys sorted), as the ONNX models record
    them; a field metadata.json lacks is null."""
    return json.dumps({field: metadata.get(field) for field in ANSWER_FIELDS}, sort_keys=True)


def onnx_file(name, precision="float32"):
    """The ONNX model of signature `name` in `precision`, relative to its version folder:
    onnx/<name>.onnx in float32, onnx/<name>.<precision>.onnx otherwise."""
    return os.path.join(ONNX_DIRECTORY, f"{name}.onnx" if precision == "float32" else f"{name}.{precision}.onnx")


def litert_file(precision):
    """The LiteRT model in `precision`, relative to its version folder."""
    return os.path.join(LITERT_DIRECTORY, f"{LITERT_SIGNATURE}.{precision}.tflite")


def onnx_models(metadata, precision="float32"):
    """What metadata.json records of the ONNX models in `precision`: {"files": {signature:
    path}, "sha256": {signature: digest}}. The float32 models are described by "onnx"
    itself, the quantized ones by "onnx" -> "quantized" -> precision.

    Raises:
        KeyError, TypeError: where metadata.json describes no such models.
    """
    described = metadata["onnx"]
    return described if precision == "float32" else described["quantized"][precision]


# A model's name is its folder under the output and the name TF Serving serves it by:
# letters, digits, "_", "-" and ".", not starting with "." (so never "..", a path or hidden).
MODEL_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")
# The highest version: TF Serving reads a version folder's name (ASCII digits) as an int64.
MAXIMUM_VERSION = 2**63 - 1
# How encoded images reach the network's size (their one home: `data.images`).
CROPS, RESIZE_RATIO = images.CROPS, images.RESIZE_RATIO


@dataclasses.dataclass(frozen=True)
class Preprocessing:
    """From an encoded image to the network's input, as in training: decoded to `channels`,
    brought to image_size x image_size by `crop`, normalised per channel.

    Attributes:
        image_size: side of the square images the network sees.
        channels: 1 (grey) or 3 (RGB); encoded images are decoded to this many.
        normalization_mean, normalization_std: per channel, on the 0-255 scale.
        crop: "resize" or "central_crop" (see `CROPS`).
    """

    image_size: int
    channels: int
    normalization_mean: tuple
    normalization_std: tuple
    crop: str = "resize"

    def __post_init__(self):
        if not isinstance(self.image_size, int) or self.image_size < 1:
            raise ValueError(f"image_size must be a positive integer. Received: image_size={self.image_size!r}")
        if self.channels not in (1, 3):
            raise ValueError(f"channels must be 1 or 3. Received: channels={self.channels!r}")
        for field in ("normalization_mean", "normalization_std"):
            if len(getattr(self, field)) != self.channels:
                raise ValueError(
                    f"{field} needs one value per channel ({self.channels}). Received: {field}={getattr(self, field)!r}"
                )
        if self.crop not in CROPS:
            raise ValueError(f"crop must be one of {sorted(CROPS)}. Received: crop={self.crop!r}")

    @classmethod
    def of(cls, config, channels):
        """The evaluation preprocessing of a training config (`keras_preact_training.train.configs.Config`)."""
        return cls(
            config.image_size,
            channels,
            tuple(config.normalization_mean),
            tuple(config.normalization_std),
            "central_crop" if config.dataset == "imagenet2012" else "resize",
        )

    @classmethod
    def from_metadata(cls, metadata):
        """The preprocessing metadata.json's "input" records (`export`)."""
        return cls(**{field: value for field, value in metadata["input"].items() if field != "pixel_range"})

    @property
    def shape(self):
        return (self.image_size, self.image_size, self.channels)


def output_shapes(classes, top_k):
    """Every signature's outputs: {name: (dtype, shape with None for the batch)}."""
    return {
        "logits": ("float32", (None, classes)),
        "probabilities": ("float32", (None, classes)),
        "class_ids": ("int64", (None,)),
        "classes": ("string", (None, top_k)),
        "scores": ("float32", (None, top_k)),
    }


def versions(directory):
    """The version numbers present in a model's folder (TF Serving's numbered subfolders: ASCII
    digits, up to `MAXIMUM_VERSION`)."""
    if not os.path.isdir(directory):
        return []
    return sorted(
        int(entry.name)
        for entry in os.scandir(directory)
        if entry.is_dir() and entry.name.isascii() and entry.name.isdigit() and int(entry.name) <= MAXIMUM_VERSION
    )


def latest_version(directory, kind="saved_model", precision="float32"):
    """`directory/<highest complete version>`: the highest version holding metadata.json and
    every file of the format `kind` (a name of `export.FORMATS`) in `precision` (for a
    SavedModel, the one TF Serving serves by default; a version folder still being copied in
    is passed over).

    Raises:
        FileNotFoundError: if `directory` holds no complete numbered version.
    """
    from . import FORMATS

    exported = FORMATS[kind]
    needed = [METADATA_FILE, *exported.needed(precision)]
    found = [
        version
        for version in versions(directory)
        if all(os.path.exists(os.path.join(directory, str(version), file)) for file in needed)
    ]
    if not found:
        what = exported.files_name if precision == "float32" else f"{precision} {exported.files_name}"
        how = "" if kind == "saved_model" else f" --format {kind} (or all)"
        how += f" --quantize {precision} --calibration-images ..." if precision != "float32" else ""
        raise FileNotFoundError(
            f"No complete version folder with {what} (<directory>/<number>/{needed[1]} and {METADATA_FILE}) in "
            f"{directory}. Export one with "
            f"`keras-preact export{how}`. Received: {directory!r}"
        )
    return os.path.join(directory, str(found[-1]))


def digests(path, relative_files):
    """{key: SHA-256} of files relative to `path`, as metadata.json records them."""
    return {key: checksums.sha256(os.path.join(path, file)) for key, file in relative_files.items()}


def read_metadata(version_path):
    """A version folder's metadata.json.

    Raises:
        FileNotFoundError, ValueError: naming the file, if it is missing or not a JSON object.
    """
    return checked_files.read_json(os.path.join(version_path, METADATA_FILE), "export the model again")
