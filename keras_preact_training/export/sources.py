"""What is exported: the network of a finished `keras-preact train` run, or a network with
keras-preact's shipped weights, each with its facts in metadata.json, written by
`versions.export_saved_model`; and a run's data read back for a check of its export."""

import dataclasses
import os

import keras
import numpy as np
import tensorflow as tf

import keras_preact
from keras_preact import pretrained

from .. import checked_files
from ..data import datasets
from ..train import configs
from . import DEFAULT_DIRECTORY, DEFAULT_TOP_K
from .contract import Preprocessing
from .versions import checked_name, export_saved_model


def export_run(
    run_dir,
    output=DEFAULT_DIRECTORY,
    name=None,
    version=None,
    top_k=DEFAULT_TOP_K,
    verbose=True,
    formats=("saved_model",),
    fold_batch_norms=True,
    precisions=("float32",),
    calibration_images=None,
):
    """Exports the model a `keras-preact train` run saved, with its run's facts.

    The run's `model.keras` is the training model (augmentation, normalisation, network);
    its normalisation layer and network are exported. The name defaults to
    "<dataset>_<model>"; formats, precisions and calibration images as `export_saved_model`'s.

    Raises:
        FileNotFoundError: if `run_dir` has no finished run (model.keras, summary.json).
        ValueError: if its model.keras cannot be read.
    """
    model_path, summary_path = (os.path.join(run_dir, file) for file in ("model.keras", "summary.json"))
    if not (os.path.exists(model_path) and os.path.exists(summary_path)):
        raise FileNotFoundError(
            f"{run_dir} holds no finished training run (model.keras and summary.json); train "
            f"with `keras-preact train --run-dir {run_dir}` first. Received: {run_dir!r}"
        )
    summary = checked_files.read_json(summary_path, "train the run again, or restore the file")
    config = run_config(summary)
    try:
        training_model = keras.saving.load_model(model_path)
    except Exception as error:
        raise ValueError(
            f"Could not read the run's model {model_path} (a truncated or corrupt file: train the run "
            f"again, or restore the file): {type(error).__name__}: {error}"
        ) from error
    network = training_model.layers[-1]
    preprocessing = Preprocessing.of(config, channels=summary["image_shape"][-1])
    name = checked_name(name or f"{summary['dataset']}_{summary['model']}")
    metadata = dict(
        model=summary["model"],
        dataset=summary["dataset"],
        test_error=summary["test_error"],
        training_steps=summary["steps"],
        training_config=summary.get("config"),
    )
    return export_saved_model(
        network,
        os.path.join(output, name),
        summary["class_names"],
        preprocessing,
        version=version,
        top_k=top_k,
        metadata=metadata,
        normalization=training_model.get_layer("normalization"),
        formats=formats,
        fold_batch_norms=fold_batch_norms,
        precisions=precisions,
        calibration_images=calibration_images,
        verbose=verbose,
    )


def export_shipped(
    model_name,
    dataset="cifar10",
    output=DEFAULT_DIRECTORY,
    name=None,
    version=None,
    top_k=DEFAULT_TOP_K,
    verbose=True,
    formats=("saved_model",),
    fold_batch_norms=True,
    precisions=("float32",),
    calibration_images=None,
):
    """Exports a network with keras-preact's shipped weights (`keras_preact.pretrained`),
    normalised with its data set's statistics, with the registry's facts in its metadata.
    The name defaults to "<dataset>_<model>", as a run's; formats, precisions and
    calibration images as `export_saved_model`'s.

    Raises:
        ValueError: for a network that has no weights for `dataset` (the message lists
            those that have), or a shipped file that fails its SHA-256 check.
    """
    network = keras_preact.get_model(model_name, weights=dataset)
    facts = pretrained.DATASETS[dataset]
    entry = pretrained.registry()[dataset][model_name]
    preprocessing = Preprocessing(
        facts["input_shape"][0], facts["input_shape"][-1], tuple(facts["mean"]), tuple(facts["std"])
    )
    metadata = dict(
        model=model_name,
        dataset=dataset,
        test_error=entry["test_error"],
        weights=dict(file=entry["file"], sha256=entry["sha256"]),
        training_config=entry.get("config"),
    )
    name = checked_name(name or f"{dataset}_{model_name}")
    return export_saved_model(
        network,
        os.path.join(output, name),
        facts["classes"],
        preprocessing,
        version=version,
        top_k=top_k,
        metadata=metadata,
        formats=formats,
        fold_batch_norms=fold_batch_norms,
        precisions=precisions,
        calibration_images=calibration_images,
        verbose=verbose,
    )


def run_config(summary):
    return configs.Config(
        **{field: tuple(value) if isinstance(value, list) else value for field, value in summary["config"].items()}
    )


def example_image(run_dir):
    """(encoded bytes, true class) of the first test image of a run's data set."""
    config = run_config(
        checked_files.read_json(os.path.join(run_dir, "summary.json"), "train the run again, or restore the file")
    )
    dataset = datasets.load(dataclasses.replace(config, test_examples=None), splits=("test",))
    split = dataset.test
    item, label = (split.items[0], split.labels[0]) if split.items is not None else next(iter(split.stream))
    item = item.numpy() if hasattr(item, "numpy") else item
    if isinstance(item, np.ndarray) and item.ndim == 3:
        encoded = tf.io.encode_png(item).numpy()
    elif isinstance(item, (str, np.str_)):
        encoded = tf.io.read_file(str(item)).numpy()
    else:
        encoded = bytes(item)
    return encoded, dataset.class_names[int(label)]
