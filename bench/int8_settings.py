"""int8 ONNX quantized three ways from the same float32 model and calibration images: unsigned
activations (U8S8), the same with 7-bit weights (`reduce_range`) and signed activations (S8S8),
their test errors on the 10,000 test images and their speed, side by side.

    python bench/int8_settings.py --data-dir ~/.cache/keras-preact/cifar10-png
    python bench/int8_settings.py --data-dir ... --models resnet20 --seconds 1

For each shipped network: `export --format onnx` (float32), then `predict_pixels.onnx`
quantized by onnxruntime's `quantize_static` (QDQ, int8 weights per channel) each way, calibrated on the first `--calibration-per-class` training images of
each class; the error of the float32 model and of each int8 model on the test images, and
images/s at batch 64 (the median of `--rounds` rounds of `--seconds`, the three models in
turn within each round, each in onnxruntime's default threads). Prints the machine, its
integer dot-product instructions (U8S8 saturates without VNNI unless its weights keep to 7
bits) and a Markdown table.
"""

import argparse
import os
import pathlib
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
from deployment_formats import calibration_set, dot_product_instructions, test_error, test_set, timed

# Each setting: the activations' type and whether the weights keep to 7 bits (onnxruntime's
# `reduce_range`, its remedy for the saturation of U8S8 without VNNI).
SETTINGS = {"U8S8": ("QUInt8", False), "U8S8, 7-bit weights": ("QUInt8", True), "S8S8": ("QInt8", False)}


def quantized(float_file, output, activation_type, reduce_range, calibration):
    """`float_file` quantized as the export does, but for the activations' type and the
    weights' range."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Batches(CalibrationDataReader):
        def __init__(self):
            self.batches = iter({"pixels": calibration[start : start + 32]} for start in range(0, len(calibration), 32))

        def get_next(self):
            return next(self.batches, None)

    prepared = output + ".prepared"
    quant_pre_process(float_file, prepared, skip_symbolic_shape=True)
    quantize_static(
        prepared,
        output,
        Batches(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=getattr(QuantType, activation_type),
        weight_type=QuantType.QInt8,
        reduce_range=reduce_range,
    )
    return output


def main():
    import onnxruntime
    from harness import machine

    from keras_preact import pretrained
    from keras_preact_training import export
    from keras_preact_training.data import images
    from keras_preact_training.export import contract

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, help="CIFAR-10 as an image folder (train/, test/)")
    parser.add_argument("--models", nargs="+", default=pretrained.shipped_networks("cifar10"))
    parser.add_argument("--calibration-per-class", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    print(machine())
    instructions = dot_product_instructions()
    print(
        f"onnxruntime {onnxruntime.__version__}; integer dot-product instructions: {', '.join(instructions) or 'none'}"
    )
    pixels, labels = test_set(arguments.data_dir)
    calibration = np.stack(
        [
            images.decode(pathlib.Path(file).read_bytes(), 3)
            for file in calibration_set(arguments.data_dir, arguments.calibration_per_class)
        ]
    )
    rows = [
        "| network | float32 error % | "
        + " | ".join(f"{name}: error %, images/s" for name in SETTINGS)
        + " | float32 images/s |",
        "|---" * (3 + len(SETTINGS)) + "|",
    ]
    for model in arguments.models:
        with tempfile.TemporaryDirectory() as output:
            path = export.export_shipped(model, output=output, formats=("onnx",), verbose=False)
            float_file = os.path.join(path, contract.onnx_file("predict_pixels"))
            files = {"float32": float_file}
            for index, (name, (activation_type, reduce_range)) in enumerate(SETTINGS.items()):
                files[name] = quantized(
                    float_file, os.path.join(output, f"{index}.onnx"), activation_type, reduce_range, calibration
                )
            sessions = {
                name: onnxruntime.InferenceSession(file, providers=["CPUExecutionProvider"])
                for name, file in files.items()
            }
            predicts = {
                name: (lambda batch, session=session: session.run(["probabilities"], {"pixels": batch})[0])
                for name, session in sessions.items()
            }
            errors = {name: 100 * test_error(predict, pixels, labels)[0] for name, predict in predicts.items()}
            speeds = timed(predicts, pixels[:64], arguments.seconds, arguments.rounds)
        cells = " | ".join(f"{errors[name]:.2f}, {speeds[name][1]:,.0f}" for name in SETTINGS)
        rows.append(f"| {model} | {errors['float32']:.2f} | {cells} | {speeds['float32'][1]:,.0f} |")
        print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
