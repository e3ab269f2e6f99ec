"""`keras-preact evaluate`: the error and per-class accuracy of a trained network.

The network is built with `include_preprocessing=True` (it takes 0-255 pixels and
normalises them with its data set's statistics, as the CIFAR configs train: CIFAR-100's for
CIFAR-100's classes, CIFAR-10's otherwise) and loads either keras-preact's shipped weights
(`--weights cifar10` or `cifar100`, checked against their SHA-256) or a `.weights.h5` file
saved from the same network. The test split (or, with `split="train"`,
the training split: how well the network fits what it learned from, in inference mode) is
read in its order, decoded as in training (`keras_preact_training.data.datasets`), one original image each (no
augmentation). With `flip`, the error of the test-time flip is measured too: each image's
class from the mean of its probabilities and its mirror image's (as many CIFAR zoos
report); the single-crop error stays the headline.
"""

import os
import time

import keras
import numpy as np

import keras_preact

from ..data import cifar10_folder, datasets
from . import EVALUATION_BATCH_SIZE, EVALUATION_SPLITS, configs, named_configs


def evaluate(
    model_name,
    weights,
    dataset="folder",
    data_dir=None,
    batch_size=EVALUATION_BATCH_SIZE,
    flip=False,
    split="test",
    precision="float32",
    examples=None,
):
    """Evaluates `model_name` with `weights` on a split of a CIFAR-10-like data set.

    Args:
        model_name: a name of `keras_preact.list_models()`.
        weights: "cifar10" or "cifar100" (shipped weights) or the path of a `.weights.h5` file.
        dataset: "folder" (`data_dir/{train,test}/<class>/*.jpg`) or "cifar10"
            (tensorflow-datasets, `data_dir` its data directory).
        data_dir: the folder (by default `keras-preact data`'s of the shipped weights' data set,
            `keras_preact_training.data.cifar10_folder.FOLDERS`, CIFAR-10's for a weights file),
            or tensorflow-datasets' data directory.
        batch_size: images per inference batch.
        flip: also measure `flip_error`, from the mean of the softmax probabilities
            of each image and of its horizontal mirror.
        split: "test" (the default), or "train" for the error on the training images.
        precision: the Keras dtype policy the network is built in: "float32" (the
            default, as `weights=` loads a network), or the precision a run trained and
            evaluated itself in, such as "mixed_bfloat16" (whose rounding moves a few
            predictions of 10,000).
        examples: the number of the split's images measured: all (`None`, the default), or
            a fixed random subset in the split's order (the positions
            `keras_preact_training.data.datasets.subset_positions` gives for seed 0), for a
            quick check.

    Returns:
        dict(split, error, per_class_accuracy={class name: accuracy}, images, predictions (the
        class index given to each image, single crop, in the order measured), seconds and
        images_per_second (of the inference), loading_seconds (reading the data and building
        the network)), and flip_error with `flip`.

    Raises:
        ValueError: for an unknown model or split, weights that do not fit, or a data set
            whose classes are not CIFAR-10's while the weights are.
        FileNotFoundError: for a missing data directory or weights file.
    """
    if model_name not in keras_preact.MODELS:
        raise ValueError(f"Unknown model. Choose one of {keras_preact.list_models()}. Received: model={model_name!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer. Received: batch_size={batch_size!r}")
    if split not in EVALUATION_SPLITS:
        raise ValueError(f"split must be one of {list(EVALUATION_SPLITS)}. Received: split={split!r}")
    if precision not in configs.PRECISIONS:
        raise ValueError(f"precision must be one of {list(configs.PRECISIONS)}. Received: precision={precision!r}")
    if examples is not None and (not isinstance(examples, int) or isinstance(examples, bool) or examples < 1):
        raise ValueError(f"examples must be a positive integer or None (all). Received: examples={examples!r}")
    # The weights are checked before the data is read: reading it takes minutes.
    shipped = keras_preact.pretrained.DATASETS.get(weights)
    if shipped is not None:
        keras_preact.pretrained.find(weights, model_name, len(shipped["classes"]), shipped["input_shape"], True)
    elif not isinstance(weights, (str, os.PathLike)) or not os.path.isfile(weights):
        raise FileNotFoundError(
            f"weights must be the path of a .weights.h5 file saved from {model_name}, or one of "
            f"{sorted(keras_preact.pretrained.DATASETS)}. Received: weights={weights!r}"
        )
    if dataset == "folder":
        data_dir = cifar10_folder.or_default(data_dir, weights)
    config = named_configs.get_config("cifar10_cpu", [f"dataset={dataset}"])
    if data_dir is not None:
        config = config.override(f"data_dir={data_dir}")
    if examples is not None:
        config = config.override(f"{split}_examples={examples}")
    loading_started = time.perf_counter()
    data_set = datasets.load(config, splits=(split,))
    names = list(data_set.class_names)
    if shipped is not None and names != list(shipped["classes"]):
        raise ValueError(
            f"The {weights} weights classify {list(shipped['classes'])}; the data set's classes "
            f"differ. Received: classes {names}"
        )
    model = network(model_name, weights, names, data_set.image_shape, precision)
    started = time.perf_counter()
    batches = datasets.input_pipeline(config).evaluation_arrays(getattr(data_set, split), batch_size)
    result = dict(split=split, **counted(model, batches, names, flip))
    seconds = time.perf_counter() - started
    return dict(
        result, seconds=seconds, images_per_second=result["images"] / seconds, loading_seconds=started - loading_started
    )


def network(model_name, weights, class_names, input_shape, precision):
    """The network with `weights`, 0-255 pixels in and logits out, built in the dtype policy
    `precision` (Keras' global policy left as it was). A weights file's network normalises with
    the statistics of the data set whose classes are `class_names` (CIFAR-10's where none is
    known), as training does."""
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy(precision)  # layers take the policy when they are made
    try:
        shipped = weights in keras_preact.pretrained.DATASETS
        model = keras_preact.get_model(
            model_name,
            weights=weights,
            include_preprocessing=shipped,
            classes=len(class_names),
            input_shape=input_shape,
            classifier_activation=None,
        )
        if shipped:
            return model
        statistics = keras_preact.pretrained.DATASETS[keras_preact.pretrained.dataset_of(class_names) or "cifar10"]
        inputs = keras.Input(input_shape)
        normalized = keras_preact.pretrained.normalization(statistics["mean"], statistics["std"])(inputs)
        return keras.Model(inputs, model(normalized), name=model.name)
    finally:
        keras.config.set_dtype_policy(policy)


def counted(model, batches, names, flip):
    """The error, per-class accuracy, image count and each image's predicted class of `model` on
    `batches` (images, labels as NumPy, which every Keras backend takes), and with `flip` the
    flip's error."""
    correct, counts = np.zeros(len(names), "int64"), np.zeros(len(names), "int64")
    flip_correct = 0
    predictions = []
    for images, labels in batches:
        logits = np.asarray(model.predict_on_batch(images), "float32")
        predicted = np.argmax(logits, axis=-1)
        predictions.append(predicted)
        np.add.at(counts, labels, 1)
        np.add.at(correct, labels, predicted == labels)
        if flip:
            mirrored = np.asarray(model.predict_on_batch(images[:, :, ::-1]), "float32")
            flip_correct += int(np.sum(np.argmax(softmax(logits) + softmax(mirrored), axis=-1) == labels))
    result = dict(
        error=1.0 - correct.sum() / counts.sum(),
        # A class without images in the measured split (a subset) has no accuracy: NaN, without NumPy's warning.
        per_class_accuracy={
            name: float(hit) / float(count) if count else float("nan")
            for name, hit, count in zip(names, correct, counts)
        },
        images=int(counts.sum()),
        predictions=np.concatenate(predictions) if predictions else np.zeros(0, "int64"),
    )
    if flip:
        result["flip_error"] = 1.0 - flip_correct / counts.sum()
    return result


def softmax(logits):
    exponentials = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exponentials / exponentials.sum(axis=-1, keepdims=True)


def report(model_name, weights, result):
    """The result as printed lines: the error, then one line per class."""
    split = EVALUATION_SPLITS[result["split"]]
    lines = [
        f"{model_name} ({weights}): {split} error {100 * result['error']:.2f} % on {result['images']:,} "
        f"images (data and network loaded in {result['loading_seconds']:.1f} s, then {result['seconds']:.1f} s: "
        f"{result['images_per_second']:.0f} images/s)",
        *(
            [
                f"with the test-time flip (mean of an image's and its mirror's probabilities): {split} error "
                f"{100 * result['flip_error']:.2f} %"
            ]
            if "flip_error" in result
            else []
        ),
        "class          accuracy",
    ]
    lines += [f"{name:<14} {100 * accuracy:6.2f} %" for name, accuracy in result["per_class_accuracy"].items()]
    return lines
