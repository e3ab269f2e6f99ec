"""Training and input-pipeline throughput on CIFAR-10 image folders: is the pipeline ever the bottleneck?

    python bench/training_throughput.py --data-dir ~/.cache/keras-preact/cifar10-png \\
        --models resnet20 resnet110 resnet164
    python bench/training_throughput.py --data-dir ~/.cache/keras-preact/cifar10-png \\
        --config cifar10_zoo --models resnet56 --window 20   # a zoo row's rate alone
    python bench/training_throughput.py --data-dir ... --config cifar10_zoo --set precision=float32

Prints the machine, then images per second of (a) the input pipeline alone (image
decoding, shuffling, batching, as training reads it) and (b) training each model with
`--config`'s recipe (the paper's by default; its optimizer, precision and augmentation,
run for a few steps) at batch 128 (`keras-preact`'s loop, on Keras' backend:
`KERAS_BACKEND=jax` times the JAX loop; the median over windows of `--window` steps
after the first, which includes tracing), with the share of the matmul peak in the
precision it computes in (bfloat16's under mixed_bfloat16) that the rate reaches, on
TensorFlow (`KERAS_BACKEND=jax` and `torch` print the rate alone).
"""

import argparse
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import input_pipeline
import keras
from harness import TRAINING_FLOPS_PER_FORWARD, forward_flops, machine, matmul_flops_per_second

import keras_preact
from keras_preact_training.train import configs, engines, loop, named_configs, precision


def pipeline_images_per_second(config, batches):
    """tf.data's rate alone (`bench/input_pipeline.py` compares it with NumPy's)."""
    return input_pipeline.images_per_second(config.override("input_pipeline=tensorflow"), "tensorflow", batches)[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, help="CIFAR-10 as an image folder (train/, test/)")
    parser.add_argument(
        "--config",
        default="cifar10_paper",
        choices=sorted(named_configs.CONFIGS),
        help="the recipe whose training step is timed (default: the paper's)",
    )
    parser.add_argument("--models", nargs="+", default=["resnet20", "resnet110", "resnet164"])
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--window", type=int, default=4, help="steps per timing window")
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument(
        "--strategy",
        default="default",
        choices=configs.STRATEGIES,
        help="data_parallel under KERAS_BACKEND=jax: every device (XLA_FLAGS=--xla_force_host_platform_device_count=N "
        "splits this CPU into N)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a field of the recipe set as `train --set` does (e.g. precision=float32)",
    )
    arguments = parser.parse_args()
    config = named_configs.CONFIGS[arguments.config].override(
        *arguments.set,
        "dataset=folder",
        f"data_dir={arguments.data_dir}",
        f"batch_size={arguments.batch_size}",
        "test_examples=500",
        "schedule_unit=steps",
        f"reference_batch_size={arguments.batch_size}",
        f"log_every={arguments.window}",
        "evaluate_every=100000",
        "checkpoint_every=100000",
        "warmup=0",
        f"duration={arguments.window * (arguments.windows + 1)}",
        f"strategy={arguments.strategy}",
    )
    config = precision.resolved(config)  # the recipe's precision, as `keras-preact train` chooses it
    engines.configure(config)
    print(f"machine: {machine()}")
    print(f"recipe: {arguments.config} ({config.precision}, nesterov={config.nesterov})")
    print(f"input pipeline, batch {arguments.batch_size}: {pipeline_images_per_second(config, 40):.0f} images/s")
    compute_dtype = keras.DTypePolicy(config.precision).compute_dtype
    # The share of the peak needs TensorFlow's matmul rate and its graph's FLOP count, which
    # time and trace TensorFlow's own kernels: measured on that backend only.
    peak = None
    if keras.backend.backend() == "tensorflow":
        peak = matmul_flops_per_second(dtype=compute_dtype)
        print(f"{compute_dtype} matmul: {peak / 1e9:.0f} GFLOP/s")
    for model in arguments.models:
        with tempfile.TemporaryDirectory() as run_dir:
            summary = loop.train(config.override(f"model={model}"), run_dir, verbose=False)
        rate = summary["training_images_per_second"]
        line = f"training {model}, batch {arguments.batch_size}: {rate:.1f} images/s"
        if peak is not None:
            flops = forward_flops(keras_preact.get_model(model, input_shape=(32, 32, 3), classes=10))
            line += f", {rate * TRAINING_FLOPS_PER_FORWARD * flops / peak:.0%} of the {compute_dtype} peak"
        print(line)


if __name__ == "__main__":
    main()
