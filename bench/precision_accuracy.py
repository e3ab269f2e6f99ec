"""Does mixed_bfloat16 cost accuracy? The zoo's recipe trained in float32 and in bfloat16.

    KERAS_BACKEND=jax python bench/precision_accuracy.py --data-dir ~/.cache/keras-preact/cifar10-png \\
        --precision mixed_bfloat16 --seed 1 --output runs.jsonl

One run of `--model` (pre-activation ResNet-20) with the zoo's recipe (config `cifar10_cpu`,
`schedule=cosine`: 30 epochs, batch 128) as `keras_preact_training.train.recipe` writes it for `model.fit`
on arrays, so it runs on every Keras backend and on a GPU; prints the machine, each
epoch, and the final-epoch test error on all 10,000 test images, and appends them as
one JSON line to `--output`. The images are decoded with Pillow (no TensorFlow needed)
and kept in `--arrays` (an .npz) for the next run.
"""

import argparse
import json
import os
import platform
import time
from concurrent import futures

import keras
import numpy as np
from harness import processor  # bench/, the script's folder
from PIL import Image

from keras_preact_training.train import named_configs, recipe

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


def machine():
    devices = []
    if keras.backend.backend() == "jax":
        import jax

        devices = [device.device_kind for device in jax.devices()]
    return (
        f"{processor()}, {os.cpu_count()} cores, devices {devices or 'CPU'}, Keras {keras.__version__} on "
        f"{keras.backend.backend()}, Python {platform.python_version()}"
    )


def decode(path):
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"), dtype=np.uint8)


def image_folder(root):
    """{split: (images uint8 N x H x W x 3, labels)} of `root/{train,test}/<class>/<image>`,
    classes numbered in sorted order as `keras_preact_training.data.datasets.image_folder` numbers them."""
    class_names = sorted(entry.name for entry in os.scandir(os.path.join(root, "train")) if entry.is_dir())
    splits = {}
    with futures.ProcessPoolExecutor() as pool:
        for split in ("train", "test"):
            paths, labels = [], []
            for label, name in enumerate(class_names):
                folder = os.path.join(root, split, name)
                files = sorted(file for file in os.listdir(folder) if file.lower().endswith(IMAGE_EXTENSIONS))
                paths += [os.path.join(folder, file) for file in files]
                labels += [label] * len(files)
            images = np.stack(list(pool.map(decode, paths, chunksize=256)))
            splits[split] = (images, np.array(labels, "int32"))
    return splits


def load(data_dir, arrays):
    if arrays and os.path.exists(arrays):
        with np.load(arrays) as saved:
            return {split: (saved[f"{split}_images"], saved[f"{split}_labels"]) for split in ("train", "test")}
    if not os.path.isdir(os.path.join(data_dir or "", "train")):
        raise FileNotFoundError(f"--data-dir must hold train/ and test/ class folders. Received: {data_dir!r}")
    splits = image_folder(data_dir)
    if arrays:
        np.savez(
            arrays,
            **{
                f"{split}_{part}": value
                for split, (images, labels) in splits.items()
                for part, value in (("images", images), ("labels", labels))
            },
        )
    return splits


class EpochLog(keras.callbacks.Callback):
    """Each epoch's training loss, accuracy and seconds, printed and kept."""

    def __init__(self, images_per_epoch):
        super().__init__()
        self.images_per_epoch = images_per_epoch
        self.epochs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.started = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self.started
        self.epochs.append(
            dict(epoch=epoch + 1, loss=float(logs["loss"]), accuracy=float(logs["accuracy"]), seconds=round(seconds, 2))
        )
        print(
            f"epoch {epoch + 1}: loss {logs['loss']:.4f}, accuracy {logs['accuracy']:.4f}, {seconds:.1f} s "
            f"({self.images_per_epoch / seconds:.0f} images/s)",
            flush=True,
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", help="CIFAR-10 as an image folder (train/, test/)")
    parser.add_argument("--arrays", help="an .npz of the decoded images: read if it exists, else written")
    parser.add_argument("--precision", choices=["float32", "mixed_bfloat16"], default="float32")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--epochs", type=float, help="the schedule's length (default: the config's 30)")
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="FIELD=VALUE",
        help="more changes to the config, as `keras-preact train --set`",
    )
    parser.add_argument("--output", help="a file to append the run's JSON line to")
    parser.add_argument("--decode-only", action="store_true", help="write --arrays and stop")
    arguments = parser.parse_args()
    print(f"machine: {machine()}", flush=True)
    splits = load(arguments.data_dir, arguments.arrays)
    if arguments.decode_only:
        return
    overrides = [
        "schedule=cosine",
        f"model={arguments.model}",
        f"seed={arguments.seed}",
        f"precision={arguments.precision}",
    ]
    if arguments.epochs:
        overrides.append(f"duration={arguments.epochs}")
    config = named_configs.CONFIGS["cifar10_cpu"].override(*overrides, *arguments.set)
    (train_images, train_labels), (test_images, test_labels) = splits["train"], splits["test"]
    steps_per_epoch = -(-len(train_images) // config.batch_size)
    epochs = round(config.duration)
    keras.config.set_dtype_policy(config.precision)
    keras.utils.set_random_seed(config.seed)
    classes = int(train_labels.max()) + 1
    model = recipe.training_model(config, train_images.shape[1:], classes, seed=config.seed)
    model.compile(
        recipe.optimizer(config, steps_per_epoch, model), recipe.loss(config.label_smoothing), metrics=["accuracy"]
    )
    log = EpochLog(len(train_images))
    started = time.perf_counter()
    model.fit(train_images, train_labels, batch_size=config.batch_size, epochs=epochs, callbacks=[log], verbose=0)
    training_seconds = time.perf_counter() - started
    _, test_accuracy = model.evaluate(test_images, test_labels, batch_size=500, verbose=0)
    _, train_accuracy = model.evaluate(train_images, train_labels, batch_size=500, verbose=0)
    result = dict(
        model=config.model,
        precision=config.precision,
        seed=config.seed,
        epochs=epochs,
        changes=arguments.set,
        test_error=round(100 * (1 - test_accuracy), 2),
        train_error=round(100 * (1 - train_accuracy), 2),
        training_seconds=round(training_seconds, 1),
        machine=machine(),
        history=log.epochs,
    )
    run = " ".join([config.model, config.precision, f"seed {config.seed}", *arguments.set])
    print(
        f"{run}: final-epoch test error {result['test_error']:.2f} % (training images, inference mode: "
        f"{result['train_error']:.2f} %) after {epochs} epochs, {training_seconds:.0f} s",
        flush=True,
    )
    if arguments.output:
        with open(arguments.output, "a") as output:
            output.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
