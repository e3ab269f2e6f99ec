"""Every deployment format of every shipped network: test error, file size and speed.

    python bench/deployment_formats.py --data-dir ~/.cache/keras-preact/cifar10-png
    python bench/deployment_formats.py --data-dir ... --models resnet20 --seconds 1

Exports each shipped CIFAR-10 network (`keras_preact.pretrained`) with `export --format all
--quantize float16 int8`, calibrated on the first `--calibration-per-class` training images
of each class (300 by default), then runs the six files on the same decoded pixels of the
10,000 test images (`predict_pixels`: uint8 in, probabilities out): the SavedModel under
TensorFlow, the float32 and int8 ONNX models under onnxruntime, and the float32, float16
and int8 LiteRT models under LiteRT's interpreter (`keras_preact_training.export.litert`). For each:
the single-crop test error, the file's size (the SavedModel: saved_model.pb and its
variables), the median latency of one image, and images/s at batch 64 (the median of
`--rounds` rounds of `--seconds`), every runtime on all cores. Each runtime is timed in a
process of its own (onnxruntime's threads go on spinning after each call and slow whatever
runs next on the same cores: `bench/runtimes.py`), its precisions in turn within each round, so that the machine's slow
moments fall on all of them alike. Prints the machine, whether
its processor has integer dot-product instructions (VNNI: int8 speed depends on them), and
the table in Markdown.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

from keras_preact_training.export import contract

FORMATS = (
    ("SavedModel", "saved_model", "float32"),
    ("ONNX", "onnx", "float32"),
    ("ONNX", "onnx", "int8"),
    ("LiteRT", "litert", "float32"),
    ("LiteRT", "litert", "float16"),
    ("LiteRT", "litert", "int8"),
)
EVALUATION_BATCH = 500
THROUGHPUT_BATCH = 64


def dot_product_instructions():
    """The processor's integer dot-product instruction sets, from /proc/cpuinfo's flags."""
    try:
        with open("/proc/cpuinfo") as file:
            flags = next((line.split(":")[1].split() for line in file if line.startswith("flags")), [])
    except OSError:
        return []
    return [flag for flag in ("avx512_vnni", "avx_vnni", "amx_int8") if flag in flags]


def test_set(data_dir):
    """uint8 pixels [10000, 32, 32, 3] of the test images, decoded as training, evaluation and
    serving decode them (`input_tensorflow.decode_image`), and their labels."""
    import tensorflow as tf

    from keras_preact import pretrained
    from keras_preact_training.data import input_tensorflow

    pixels, labels = [], []
    for label, name in enumerate(pretrained.DATASETS["cifar10"]["classes"]):
        folder = os.path.join(data_dir, "test", name)
        for file in sorted(os.listdir(folder)):
            pixels.append(input_tensorflow.decode_image(tf.io.read_file(os.path.join(folder, file)), 3).numpy())
            labels.append(label)
    return np.stack(pixels), np.array(labels)


def calibration_set(data_dir, per_class):
    from keras_preact import pretrained

    folders = [os.path.join(data_dir, "train", name) for name in pretrained.DATASETS["cifar10"]["classes"]]
    return [os.path.join(folder, file) for folder in folders for file in sorted(os.listdir(folder))[:per_class]]


def runner(path, kind, precision):
    """(uint8 pixels -> probabilities, size in bytes) of one exported file, importing only its runtime."""
    metadata = contract.read_metadata(path)
    if kind == "saved_model":
        import tensorflow as tf

        function = tf.saved_model.load(path).signatures["predict_pixels"]
        size = os.path.getsize(os.path.join(path, "saved_model.pb")) + sum(
            os.path.getsize(os.path.join(path, "variables", file))
            for file in os.listdir(os.path.join(path, "variables"))
        )
        return (lambda pixels: function(pixels=tf.constant(pixels))["probabilities"].numpy()), size
    if kind == "onnx":
        import onnxruntime

        file = os.path.join(path, contract.onnx_models(metadata, precision)["files"]["predict_pixels"])
        session = onnxruntime.InferenceSession(file, providers=["CPUExecutionProvider"])
        return (lambda pixels: session.run(["probabilities"], {"pixels": pixels})[0]), os.path.getsize(file)
    from keras_preact_training.export import litert

    file = os.path.join(path, metadata["litert"]["files"][precision])
    return litert.LiteRTModel(file), os.path.getsize(file)


def test_error(predict, pixels, labels):
    predicted = np.concatenate(
        [
            predict(pixels[start : start + EVALUATION_BATCH]).argmax(-1)
            for start in range(0, len(pixels), EVALUATION_BATCH)
        ]
    )
    return float((predicted != labels).mean()), predicted


def timed(predicts, batch, seconds, rounds):
    """{name: (median seconds per call, median images/s)} of `predicts` ({name: function}) on
    `batch`, over `rounds` rounds of about `seconds` each, the functions in turn within a round."""
    per_call = {name: [] for name in predicts}
    for predict in predicts.values():
        predict(batch)
    for _ in range(rounds):
        for name, predict in predicts.items():
            calls, started = 0, time.perf_counter()
            while time.perf_counter() - started < seconds:
                predict(batch)
                calls += 1
            per_call[name].append((time.perf_counter() - started) / calls)
    return {
        name: (statistics.median(values), len(batch) / statistics.median(values)) for name, values in per_call.items()
    }


def speeds(path, kind, pixels_file, seconds, rounds):
    """{precision: {"latency": seconds for one image, "throughput": images/s at THROUGHPUT_BATCH}}
    of one format's files, measured in a process of their own (`--time`), in turn."""
    result = subprocess.run(
        [sys.executable, __file__, "--time", path, kind, pixels_file, str(seconds), str(rounds)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def time_alone(path, kind, pixels_file, seconds, rounds):
    predicts = {precision: runner(path, kind, precision)[0] for name, each, precision in FORMATS if each == kind}
    pixels = np.load(pixels_file)
    latencies = timed(predicts, pixels[:1], float(seconds), int(rounds))
    throughputs = timed(predicts, pixels[:THROUGHPUT_BATCH], float(seconds), int(rounds))
    print(
        json.dumps(
            {
                precision: dict(latency=latencies[precision][0], throughput=throughputs[precision][1])
                for precision in predicts
            }
        )
    )


def main():
    if sys.argv[1:2] == ["--time"]:
        return time_alone(*sys.argv[2:])
    import onnxruntime
    from harness import machine

    from keras_preact import pretrained
    from keras_preact_training import export

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, help="CIFAR-10 as an image folder (train/, test/)")
    parser.add_argument("--models", nargs="+", default=pretrained.shipped_networks("cifar10"))
    parser.add_argument("--calibration-per-class", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    arguments = parser.parse_args()
    instructions = dot_product_instructions()
    print(machine())
    print(
        f"onnxruntime {onnxruntime.__version__}, ai-edge-litert {export.FORMATS['litert'].package_versions()['ai_edge_litert']}; "
        f"integer dot-product instructions: {', '.join(instructions) or 'none (no VNNI)'}"
    )
    pixels, labels = test_set(arguments.data_dir)
    calibration = calibration_set(arguments.data_dir, arguments.calibration_per_class)
    print(f"{len(pixels)} test images; {len(calibration)} calibration images\n")
    print(
        "| network | format | precision | test error (%) | vs SavedModel (points) | top-1 agrees with SavedModel "
        "| file (MB) | latency, batch 1 (ms) | images/s, batch 64 | vs SavedModel | vs the format's float32 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as output:
        pixels_file = os.path.join(output, "pixels.npy")
        np.save(pixels_file, pixels[:THROUGHPUT_BATCH])
        for model in arguments.models:
            path = export.export_shipped(
                model,
                output=output,
                formats=export.chosen("all"),
                precisions=("float32", *export.quantized_precisions()),
                calibration_images=calibration,
                verbose=False,
            )
            reference, float32, timings = None, {}, {}
            for name, kind, precision in FORMATS:
                predict, size = runner(path, kind, precision)
                error, predicted = test_error(predict, pixels, labels)
                del predict  # its runtime's threads and memory go before the next is timed
                if kind not in timings:
                    timings[kind] = speeds(path, kind, pixels_file, arguments.seconds, arguments.rounds)
                latency, throughput = (timings[kind][precision][key] for key in ("latency", "throughput"))
                reference = reference or (error, predicted, throughput)
                float32.setdefault(kind, throughput)
                print(
                    f"| {model} | {name} | {precision} | {100 * error:.2f} | {100 * (error - reference[0]):+.2f} | "
                    f"{100 * (predicted == reference[1]).mean():.2f} % | {size / 1e6:.2f} | {1000 * latency:.2f} | "
                    f"{throughput:.0f} | {throughput / reference[2]:.2f}x | {throughput / float32[kind]:.2f}x |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
