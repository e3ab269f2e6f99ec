"""The input pipelines alone on CIFAR-10 image folders: images per second of training batches, with
nothing else running, for the NumPy pipeline (in memory, and decoding files batch by batch)
and tf.data's.

    python bench/input_pipeline.py --data-dir ~/.cache/keras-preact/cifar10-png
    python bench/input_pipeline.py --data-dir DIR --pipelines numpy   # without TensorFlow
    python bench/input_pipeline.py --data-dir DIR --processes 2       # one process's part of each batch

Prints the machine, then for each pipeline the seconds to prepare the 50,000 training images
(`datasets.load`: the NumPy pipeline decodes them into memory there, tf.data checks that each
decodes) and the images per second of `--batches` batches of 128 after 5 unmeasured ones, as
`keras-preact train` reads them (shuffled, decoded, batched, float32). A GPU that trains at
R images/s needs a pipeline of more than R. With `--processes N` a process reads its part of
each batch, as each of N processes of `--strategy data_parallel` does: its images per second.
"""

import argparse
import os
import platform
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
from harness import processor

from keras_preact_training.data import datasets, input_numpy
from keras_preact_training.train import configs, named_configs

CASES = {
    "numpy": "NumPy and Pillow, decoded into memory",
    "numpy-files": "NumPy and Pillow, each batch's files decoded",
    "tensorflow": "tf.data, each batch's files decoded",
}


def images_per_second(config, case, batches, shard=(0, 1)):
    started = time.perf_counter()
    if case == "numpy-files":
        limit, input_numpy.MEMORY_LIMIT_BYTES = input_numpy.MEMORY_LIMIT_BYTES, 0
    try:
        dataset = datasets.load(config)
    finally:
        if case == "numpy-files":
            input_numpy.MEMORY_LIMIT_BYTES = limit
    prepared = time.perf_counter() - started
    pipeline = datasets.input_pipeline(config)
    steps_per_epoch = configs.steps_per_epoch(dataset.train.size, config.batch_size)
    iterator = iter(pipeline.training_arrays(dataset.train, config, steps_per_epoch, 0, batches + 5, shard))
    for _ in range(5):
        next(iterator)
    started = time.perf_counter()
    total = 0.0
    for _ in range(batches):
        images, _ = next(iterator)
        total += float(images[0, 0, 0, 0])  # touch the batch
    return prepared, batches * config.batch_size // shard[1] / (time.perf_counter() - started)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, help="CIFAR-10 as an image folder (train/, test/)")
    parser.add_argument("--pipelines", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--processes", type=int, default=1, help="processes sharing each batch (data_parallel)")
    arguments = parser.parse_args()
    print(f"machine: {processor()}, {os.cpu_count()} cores, NumPy {np.__version__}, Python {platform.python_version()}")
    for case in arguments.pipelines:
        pipeline = "tensorflow" if case == "tensorflow" else "numpy"
        config = named_configs.CONFIGS["cifar10_zoo"].override(
            f"data_dir={arguments.data_dir}", f"input_pipeline={pipeline}"
        )
        batches = arguments.batches if case == "numpy" else max(arguments.batches // 10, 10)
        prepared, rate = images_per_second(config, case, batches, (0, arguments.processes))
        part = f", process 0's {config.batch_size // arguments.processes} of each" if arguments.processes > 1 else ""
        print(
            f"{case:<12} ({CASES[case]}): prepared in {prepared:.1f} s, {rate:,.0f} images/s "
            f"({batches} batches of {config.batch_size}{part})"
        )


if __name__ == "__main__":
    main()
