"""Inference through Keras, the exported SavedModel and onnxruntime, with BatchNorm folded or not.

    python bench/runtimes.py                                  # resnet20 resnet164 resnet1001
    python bench/runtimes.py --models resnet20 --batches 1 32 --rounds 5

Prints the machine, then per model (ResNet-1001 with its units as loops, the default):
the seconds to export it with `keras_preact_training.export.export_saved_model` as a SavedModel and as
ONNX, each with BatchNorm folded into the convolutions (the default) and as it trains
(`fold_batch_norms=False`), and the size of what each writes; then, per batch size, the
images/s of six ways to run the same network on normalised images: the Keras model
(`predict_on_batch`) and its folded copy (`keras_preact.fold_batch_norms`), the
SavedModel's `predict_normalized` signature and onnxruntime's `predict_normalized.onnx`
(2 threads, as the server runs it), each folded and not. The folded and unfolded
variants of one runtime are measured in turn, `--rounds` times about a second each, and
the median is printed, so that a slow moment of a shared machine falls on both alike;
the runtimes one after the other (onnxruntime's threads spin for a while after each
call, which slows whatever runs next on the same cores). The networks have random weights (the
speed does not depend on them) with the BatchNorm statistics of a batch of random images,
and a bottleneck unit's last convolution scaled by 0.1, as after training: an untrained
ResNet-1001 amplifies float rounding 1e6-fold (tests/test_export.py), which the export's
onnxruntime check would refuse.
"""

import argparse
import os
import re
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import onnxruntime
import tensorflow as tf
from harness import machine

import keras_preact
from keras_preact_training import export
from keras_preact_training.export import contract, networks, versions
from keras_preact_training.train import named_configs

CIFAR = export.Preprocessing.of(named_configs.CONFIGS["cifar10_paper"], channels=3)
CLASS_NAMES = [f"class_{index}" for index in range(10)]
FOLDINGS = {"": False, " folded": True}
SECONDS_PER_MEASUREMENT = 1.0


def exports(network, directory):
    """Exports `network` four times (SavedModel and ONNX, folded and not): {(format, folded): (seconds, MB, path)}."""
    results = {}
    for kind in ("saved_model", "onnx"):
        for label, fold in FOLDINGS.items():
            started = time.perf_counter()
            path = export.export_saved_model(
                network, directory, CLASS_NAMES, CIFAR, formats=(kind,), fold_batch_norms=fold, verbose=False
            )
            seconds = time.perf_counter() - started
            onnx_file = os.path.join(path, contract.onnx_file("predict_normalized"))
            megabytes = (
                versions.directory_megabytes(path) if kind == "saved_model" else os.path.getsize(onnx_file) / 2**20
            )
            results[kind, label] = (seconds, megabytes, path)
    return results


def runners(network, exported):
    """{name: function of a float32 batch} for the six ways to run the network."""
    functions = {}
    for label, fold in FOLDINGS.items():
        model = keras_preact.fold_batch_norms(network) if fold else network
        functions[f"Keras{label}"] = model.predict_on_batch
    for label in FOLDINGS:
        signature = tf.saved_model.load(exported["saved_model", label][2]).signatures["predict_normalized"]
        functions[f"SavedModel{label}"] = lambda batch, signature=signature: signature(normalized=tf.constant(batch))
    for label in FOLDINGS:
        session = onnxruntime.InferenceSession(
            os.path.join(exported["onnx", label][2], contract.onnx_file("predict_normalized")),
            providers=["CPUExecutionProvider"],
        )
        functions[f"onnxruntime{label}"] = lambda batch, session=session: session.run(["logits"], {"normalized": batch})
    return functions


def images_per_second(functions, batch, rounds):
    """The median images/s of each function over `rounds` measurements, interleaved."""
    for function in functions.values():  # traced, compiled, warmed
        function(batch)
    rates = {name: [] for name in functions}
    for _ in range(rounds):
        for name, function in functions.items():
            calls, started = 0, time.perf_counter()
            while calls < 2 or time.perf_counter() - started < SECONDS_PER_MEASUREMENT:
                function(batch)
                calls += 1
            rates[name].append(calls * len(batch) / (time.perf_counter() - started))
    return {name: statistics.median(values) for name, values in rates.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet20", "resnet164", "resnet1001"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--rounds", type=int, default=5)
    arguments = parser.parse_args()
    print(f"machine: {machine()}, onnxruntime {onnxruntime.__version__}", flush=True)
    rows = []
    for name in arguments.models:
        network = keras_preact.get_model(name, input_shape=CIFAR.shape, classes=len(CLASS_NAMES))
        for weight in network.weights:
            if re.search(r"conv3[/_]kernel$", weight.path):
                weight.assign(weight * 0.1)
        pixels = np.random.default_rng(0).integers(0, 256, size=(64, *CIFAR.shape)).astype("float32")
        normalized = np.asarray(networks.normalization_layer(CIFAR)(pixels), "float32")
        keras_preact.analysis.set_batch_norm_statistics(network, normalized)
        with tempfile.TemporaryDirectory() as directory:
            exported = exports(network, os.path.join(directory, name))
            print(
                f"{name} export: "
                + ", ".join(
                    f"{kind}{label} {seconds:.1f} s {megabytes:.1f} MB"
                    for (kind, label), (seconds, megabytes, _) in exported.items()
                ),
                flush=True,
            )
            functions = runners(network, exported)
            for batch_size in arguments.batches:
                rates = {}
                for runtime in ("Keras", "SavedModel", "onnxruntime"):
                    rates.update(
                        images_per_second(
                            {f"{runtime}{label}": functions[f"{runtime}{label}"] for label in FOLDINGS},
                            normalized[:batch_size],
                            arguments.rounds,
                        )
                    )
                rows.append((name, batch_size, rates))
                print(
                    f"{name} batch {batch_size}: " + ", ".join(f"{key} {value:.1f}" for key, value in rates.items()),
                    flush=True,
                )
    print("\nimages/s (median of interleaved rounds); in brackets: folded / not folded")
    print("| model | batch | Keras | SavedModel | onnxruntime |")
    print("|---|---|---|---|---|")
    for name, batch_size, rates in rows:
        cells = [
            f"{rates[kind]:.1f} -> {rates[kind + ' folded']:.1f} ({rates[kind + ' folded'] / rates[kind]:.2f}x)"
            for kind in ("Keras", "SavedModel", "onnxruntime")
        ]
        print(f"| {name} | {batch_size} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
