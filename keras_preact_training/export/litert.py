"""LiteRT (TensorFlow Lite) models of the `predict_pixels` signature, for phones, edge devices
and microcontrollers: uint8 pixels [batch, H, W, C] (0-255) in, float32 probabilities out.

TensorFlow's converter writes them (`tf.lite.TFLiteConverter`) in three precisions:
float32; float16 (weights stored in half precision, computed in float32 where the device has
no half-precision arithmetic); and full-integer int8 (every operation in 8-bit integers,
scales calibrated on images the user names, `keras_preact_training.export.calibration`), the only
kind integer-only accelerators run. LiteRT's own interpreter (the `ai-edge-litert` package,
not TensorFlow's deprecated `tf.lite.Interpreter`) runs and checks each file, and needs
no TensorFlow to (`LiteRTModel`).
"""

import os
import warnings

import numpy as np

from . import Format, contract, register

# What installs LiteRT's interpreter.
EXTRA = 'pip install "keras-preact[litert]"'

# The largest difference of probabilities between the float32 LiteRT model under LiteRT's
# interpreter and the network it was converted from: float32 rounding only.
TOLERANCE = 1e-4


def require_litert():
    """Raises an ImportError that says how to install LiteRT's interpreter where it is missing."""
    try:
        from ai_edge_litert import interpreter  # noqa: F401
    except ImportError:
        raise ImportError(f"LiteRT export needs LiteRT's interpreter (ai-edge-litert): {EXTRA}") from None


def write(version):
    """Writes the LiteRT models of `version` (an `export.versions.Version`) in the precisions it
    asks for; returns metadata.json's "litert" entry."""
    from .networks import SignatureModel, normalization_constants

    pixel_model = SignatureModel(version.separated, *normalization_constants(version.normalization))
    shape, precisions = version.preprocessing.shape, version.precisions["litert"]
    files = export_litert(pixel_model, version.path, shape, precisions, version.pixels)
    return dict(
        litert=dict(
            signature=contract.LITERT_SIGNATURE,
            input=contract.SIGNATURES[contract.LITERT_SIGNATURE].describe(shape),
            output=contract.LITERT_OUTPUT,
            files=files,
            sha256=contract.digests(version.path, files),
            **(dict(calibration_images=len(version.pixels)) if "int8" in files else {}),
        )
    )


def package_versions():
    from importlib.metadata import version

    return {"ai_edge_litert": version("ai-edge-litert")}


register(
    Format(
        name="litert",
        title="LiteRT",
        files_name="LiteRT models",
        precisions=("float32", "float16", "int8"),
        write=write,
        needed=lambda precision: [contract.litert_file(precision)],
        written=lambda metadata: list(metadata["litert"]["files"].values()),
        require=require_litert,
        package_versions=package_versions,
        checked_by="LiteRT's interpreter",
    )
)


def convert(pixel_model, shape, precision, calibration=None):
    """The LiteRT model (bytes) of `pixel_model` (uint8 pixels -> {"probabilities": ...}) in
    `precision`; int8 calibrated on `calibration`, uint8 pixels [count, *shape]."""
    import tensorflow as tf  # the converter only: LiteRTModel runs without TensorFlow

    @tf.function(input_signature=[tf.TensorSpec((None, *shape), tf.uint8, name="pixels")])
    def predict_pixels(pixels):
        return {contract.LITERT_OUTPUT: pixel_model(pixels)[contract.LITERT_OUTPUT]}

    # The function is the converter's trackable object: given the Keras model instead, the
    # converter's SavedModel round trip answers NaN probabilities (TensorFlow 2.21).
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [predict_pixels.get_concrete_function()], predict_pixels
    )
    if precision == "float16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    elif precision == "int8":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: (
            [calibration[index : index + 1]] for index in range(len(calibration))
        )
        # Every operation in int8, or the conversion fails: the uint8 pixels enter as they
        # are (the graph's first operation casts them) and the probabilities leave in float32.
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    with warnings.catch_warnings():
        # The pixels are uint8 already: the converter has no input statistics to ask for.
        warnings.filterwarnings("ignore", "Statistics for quantized inputs were expected")
        return converter.convert()


def export_litert(pixel_model, path, shape, precisions, calibration=None):
    """Writes `<path>/litert/predict_pixels.<precision>.tflite` for each of `precisions`, then
    runs each with LiteRT's interpreter on random pixels against `pixel_model`: a float32
    model whose probabilities differ by more than TOLERANCE, or any model that does not
    answer probabilities, is an error.

    Returns:
        {precision: file path relative to `path`}.
    """
    pixels = np.random.default_rng(0).integers(0, 256, size=(4, *shape)).astype(np.uint8)
    expected = pixel_model(pixels)[contract.LITERT_OUTPUT].numpy()
    os.makedirs(os.path.join(path, contract.LITERT_DIRECTORY), exist_ok=True)
    files = {}
    for precision in precisions:
        files[precision] = contract.litert_file(precision)
        with open(os.path.join(path, files[precision]), "wb") as file:
            file.write(convert(pixel_model, shape, precision, calibration))
        probabilities = LiteRTModel(os.path.join(path, files[precision]))(pixels)
        if probabilities.shape != expected.shape or not np.allclose(probabilities.sum(axis=-1), 1, atol=0.02):
            raise ValueError(
                f"The LiteRT model {files[precision]} answers no probabilities of shape {expected.shape} "
                f"under LiteRT's interpreter. Received: shape {probabilities.shape}"
            )
        difference = np.abs(probabilities - expected).max()
        if precision == "float32" and not difference <= TOLERANCE:
            raise ValueError(
                f"The LiteRT model {files[precision]} computes other probabilities than the network under "
                f"LiteRT's interpreter on random pixels: difference {difference:.2g}, where float32 rounding "
                f"stays under {TOLERANCE:g}. Export with --format saved_model or onnx."
            )
    return files


class LiteRTModel:
    """A LiteRT model of `predict_pixels` under LiteRT's interpreter: uint8 pixels [batch, H, W,
    C] -> float32 probabilities [batch, classes], for any batch size.

    Args:
        path: the .tflite file.
        threads: the interpreter's threads (default: one per core).

    Raises:
        ValueError: naming the file, where it is not a LiteRT model of pixels.
        ImportError: where ai-edge-litert is not installed.
    """

    def __init__(self, path, threads=None):
        require_litert()
        from ai_edge_litert.interpreter import Interpreter

        try:
            self.interpreter = Interpreter(model_path=path, num_threads=threads or os.cpu_count())
        except (ValueError, RuntimeError) as error:
            raise ValueError(
                f"Could not load the LiteRT model {path} (missing, truncated or corrupt: export it again): {error}"
            ) from None
        self.input = self.interpreter.get_input_details()[0]
        self.output = self.interpreter.get_output_details()[0]
        if self.input["dtype"] != np.uint8 or len(self.input["shape_signature"]) != 4:
            raise ValueError(
                f"The LiteRT model {path} takes {self.input['dtype'].__name__} {list(self.input['shape_signature'])}, "
                "where predict_pixels takes uint8 [batch, height, width, channels]: export it again."
            )
        self.shape = tuple(int(size) for size in self.input["shape_signature"][1:])
        self.batch = None

    def __call__(self, pixels):
        pixels = np.asarray(pixels, dtype=np.uint8)
        if pixels.shape[1:] != self.shape:
            raise ValueError(f"pixels must be [batch, {', '.join(map(str, self.shape))}]. Received: {pixels.shape}")
        if len(pixels) != self.batch:
            self.interpreter.resize_tensor_input(self.input["index"], pixels.shape)
            self.interpreter.allocate_tensors()
            self.batch = len(pixels)
        self.interpreter.set_tensor(self.input["index"], pixels)
        self.interpreter.invoke()
        return self.interpreter.get_tensor(self.output["index"]).copy()
