"""SavedModel export, size and reload, and requests per second of the REST server.

    python bench/export_serving.py --models resnet110 resnet164 resnet1001 --serve resnet164

Prints the machine, then per model: seconds to build it, to export it with
`keras_preact_training.export.export_saved_model` (three signatures, one traced network), the size
of the version folder, seconds to reload it with `tf.saved_model.load` and to its first
prediction. `--serve` starts `keras-preact serve` on the exported model and
measures requests per second from `--clients` concurrent clients, each sending
`--requests` requests of one 32 x 32 JPEG.
"""

import argparse
import base64
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf
from harness import machine

import keras_preact
from keras_preact_training import export
from keras_preact_training.export import versions
from keras_preact_training.train import named_configs

CIFAR = export.Preprocessing.of(named_configs.CONFIGS["cifar10_paper"], channels=3)
CLASS_NAMES = [f"class_{index}" for index in range(10)]


def exported(name, directory, formats=("saved_model",), fold_batch_norms=True):
    """Builds `name` with the BatchNorm statistics of a batch, exports it (BatchNorm folded
    unless told not to); returns the timings."""
    started = time.perf_counter()
    network = keras_preact.get_model(name, input_shape=CIFAR.shape, classes=len(CLASS_NAMES))
    build = time.perf_counter() - started
    images = np.random.default_rng(0).normal(size=(16, *CIFAR.shape)).astype("float32")
    keras_preact.analysis.set_batch_norm_statistics(network, images)
    started = time.perf_counter()
    path = export.export_saved_model(
        network,
        os.path.join(directory, name),
        CLASS_NAMES,
        CIFAR,
        formats=formats,
        fold_batch_norms=fold_batch_norms,
        verbose=False,
    )
    export_seconds = time.perf_counter() - started
    started = time.perf_counter()
    signature = tf.saved_model.load(path).signatures["serving_default"]
    reload_seconds = time.perf_counter() - started
    signature(images=tf.constant([jpeg(0)]))
    first_prediction = time.perf_counter() - started
    return path, dict(
        build_s=build,
        export_s=export_seconds,
        megabytes=versions.directory_megabytes(path),
        reload_s=reload_seconds,
        reload_and_first_prediction_s=first_prediction,
    )


def jpeg(seed):
    pixels = np.random.default_rng(seed).integers(0, 256, size=CIFAR.shape, dtype=np.uint8)
    return tf.io.encode_jpeg(pixels).numpy()


def requests_per_second(model_dir, clients, requests):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "keras_preact_training", "serve", model_dir, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        server.stdout.readline()  # "Serving ..." once the model is loaded
        url = f"http://127.0.0.1:{port}/v1/models/{os.path.basename(model_dir)}:predict"
        body = json.dumps({"instances": [{"b64": base64.b64encode(jpeg(1)).decode()}]}).encode()

        def client(_):
            for _ in range(requests):
                with urllib.request.urlopen(urllib.request.Request(url, body)) as response:
                    json.load(response)

        client(None)  # warm-up
        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(clients) as pool:
            list(pool.map(client, range(clients)))
        return clients * requests / (time.perf_counter() - started)
    finally:
        server.terminate()
        server.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet110", "resnet164", "resnet1001"])
    parser.add_argument("--serve", nargs="*", default=["resnet164"], help="models to serve and load-test")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=25, help="requests per client")
    arguments = parser.parse_args()
    print(f"machine: {machine()}")
    print("| model | build s | export s | SavedModel MB | reload s | reload + first prediction s |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as directory:
        paths = {}
        for name in arguments.models:
            paths[name], figures = exported(name, directory)
            print(
                f"| {name} | {figures['build_s']:.1f} | {figures['export_s']:.1f} | {figures['megabytes']:.1f} | "
                f"{figures['reload_s']:.1f} | {figures['reload_and_first_prediction_s']:.1f} |",
                flush=True,
            )
        for name in arguments.serve:
            if name not in paths:
                paths[name], _ = exported(name, directory)
            rate = requests_per_second(os.path.dirname(paths[name]), arguments.clients, arguments.requests)
            print(
                f"{name} served: {rate:.1f} requests/s (one 32x32 JPEG each, {arguments.clients} concurrent "
                f"clients x {arguments.requests} requests)",
                flush=True,
            )


if __name__ == "__main__":
    main()
