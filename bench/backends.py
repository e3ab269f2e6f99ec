"""The same training step and inference on Keras' TensorFlow, JAX and PyTorch backends.

    python bench/backends.py                                  # resnet20 resnet164, batch 128
    python bench/backends.py --models resnet20 --backends tensorflow jax torch --steps 10

For each network and backend, in a fresh process (`KERAS_BACKEND` is read once, at
import): seconds to build it, seconds from the first `train_on_batch` call to its end
(tracing and compiling included), the median seconds of `--steps` later training steps
(SGD with momentum 0.9, cross-entropy, the network's weight decay), and inference
images/s (`predict_on_batch`, median of as many batches), on random 32x32 images. The
network is built with the backend's defaults: on TensorFlow, BatchNorm's fused kernel;
on JAX, the portable `keras.ops` path compiled by XLA; on PyTorch, the portable path run
eagerly (Keras' torch trainer does not compile by default).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def measure(name, batch, steps):
    """Runs in the child process: the figures of one network on this process's backend."""
    import keras
    import numpy as np

    import keras_preact

    started = time.perf_counter()
    model = keras_preact.get_model(name, input_shape=(32, 32, 3), classes=10, classifier_activation=None)
    build = time.perf_counter() - started
    model.compile(
        optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    rng = np.random.default_rng(0)
    images = rng.normal(size=(batch, 32, 32, 3)).astype("float32")
    labels = rng.integers(0, 10, size=(batch,))
    started = time.perf_counter()
    model.train_on_batch(images, labels)
    first = time.perf_counter() - started
    later = []
    for _ in range(steps):
        started = time.perf_counter()
        model.train_on_batch(images, labels)
        later.append(time.perf_counter() - started)
    model.predict_on_batch(images)
    inference = []
    for _ in range(steps):
        started = time.perf_counter()
        model.predict_on_batch(images)
        inference.append(batch / (time.perf_counter() - started))
    return dict(
        build_s=build,
        first_step_s=first,
        step_s=statistics.median(later),
        images_per_second=batch / statistics.median(later),
        inference_per_second=statistics.median(inference),
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet20", "resnet164"])
    parser.add_argument("--backends", nargs="+", default=["tensorflow", "jax", "torch"])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "BATCH", "STEPS"), help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.child:
        name, batch, steps = arguments.child
        print(json.dumps(measure(name, int(batch), int(steps))))
        return
    from importlib import metadata

    from harness import machine

    versions = ", ".join(
        f"{package} {metadata.version(package)}" for package in ("tensorflow", "jax", "torch", "keras")
    )
    print(f"machine: {machine()}; {versions}")
    print("| model | backend | batch | build s | first step s | step s | train img/s | infer img/s |")
    print("|---|---|---|---|---|---|---|---|")
    for name in arguments.models:
        for backend in arguments.backends:
            child = subprocess.run(
                [sys.executable, __file__, "--child", name, str(arguments.batch), str(arguments.steps)],
                env=dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3"),
                capture_output=True,
                text=True,
            )
            if child.returncode != 0:
                print(f"| {name} | {backend} | failed: {child.stderr.strip().splitlines()[-1]} |")
                continue
            figures = json.loads(child.stdout.strip().splitlines()[-1])
            print(
                f"| {name} | {backend} | {arguments.batch} | {figures['build_s']:.1f} | "
                f"{figures['first_step_s']:.1f} | "
                f"{figures['step_s']:.3f} | {figures['images_per_second']:.1f} | "
                f"{figures['inference_per_second']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
