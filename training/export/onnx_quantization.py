"""int8 ONNX models beside the float32 ones, with onnxruntime's static quantization.

Each float32 ONNX model (`contract.ONNX_MODELS`) is quantized as `contract.ONNX_INT8_SETTINGS`
says: the QDQ format (quantize and dequantize pairs around each operation, which onnxruntime
fuses into integer kernels), weights int8 per output channel, activations int8 (S8S8) with
scales calibrated on images the user names (`keras_preact_training.export.calibration`); the
contract says why signed activations, and docs/benchmarks.md what they cost.
"""

import logging
import os

import numpy as np

from . import contract

# Images per calibration batch fed to onnxruntime's calibrator (a memory bound only).
CALIBRATION_BATCH = 32


def quantize_onnx(path, files, pixels, normalize):
    """Writes the int8 model of each float32 ONNX model in `files` ({signature: path relative
    to `path`}), calibrated on `pixels` (uint8 [count, H, W, C]): the pixels themselves for
    `predict_pixels`, `normalize(pixels)` for `predict_normalized`.

    Returns:
        {signature: int8 file path relative to `path`}.
    """
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Batches(CalibrationDataReader):
        def __init__(self, key, images):
            self.batches = iter(
                {key: images[start : start + CALIBRATION_BATCH]} for start in range(0, len(images), CALIBRATION_BATCH)
            )

        def get_next(self):
            return next(self.batches, None)

    quantized = {}
    for name, file in files.items():
        signature = contract.SIGNATURES[name]
        images = pixels if signature.dtype == "uint8" else np.asarray(normalize(pixels), dtype=np.float32)
        quantized[name] = contract.onnx_file(name, "int8")
        prepared = os.path.join(path, quantized[name] + ".prepared")
        root = logging.getLogger()
        level = root.level
        # The quantizer warns through the root logger of every BatchNorm scale (a vector) it
        # cannot quantize per channel: those are quantized per tensor, as they should be.
        root.setLevel(logging.ERROR)
        try:
            # Graph optimisation and ONNX shape inference first, as onnxruntime recommends (its
            # symbolic shape inference cannot follow tf2onnx's batch dimension, and is not needed).
            quant_pre_process(os.path.join(path, file), prepared, skip_symbolic_shape=True)
            quantize_static(
                prepared,
                os.path.join(path, quantized[name]),
                Batches(signature.key, images),
                quant_format=QuantFormat.QDQ,
                per_channel=True,
                activation_type=QuantType.QInt8,  # contract.ONNX_INT8_SETTINGS
                weight_type=QuantType.QInt8,
            )
        finally:
            root.setLevel(level)
            if os.path.exists(prepared):
                os.remove(prepared)
    return quantized
