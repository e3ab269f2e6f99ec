"""Export networks as version folders that TF Serving loads as they are.

`export_saved_model` writes `<directory>/<version>/`, the versioned layout of TF Serving
(`saved_models/<name>/<version>/` by default): each format asked for (`export.FORMATS`: the
SavedModel, ONNX and LiteRT models) writes its files there from one `Version`, and
`metadata.json` records the model, the class names, the input and its preprocessing, each
format's files with their precision and SHA-256, the training config and the final test
error. The folder is written beside the final one and renamed: TF Serving, polling the
model's folder, never sees a half-written version, and a failed export leaves nothing.

By default the exported graph is the network with its BatchNorms folded into the
convolutions before them (`keras_preact.fold_batch_norms`): the same outputs to float32
rounding, fewer operations per image. `fold_batch_norms=False` exports it as it trains.
"""

import dataclasses
import datetime
import functools
import json
import os
import shutil
import time

import keras
import numpy as np
import tensorflow as tf

import keras_preact

from .. import checked_files
from . import DEFAULT_TOP_K, FORMATS, calibration, contract
from .contract import MODEL_NAME, Preprocessing, versions
from .networks import inference_network, normalization_layer


@dataclasses.dataclass
class Version:
    """One version folder as it is written: what each format writes its files from.

    Attributes:
        path: the folder being written (renamed into place when every format is in).
        trained: the network as it trained.
        network: the network exported (its BatchNorms folded where asked).
        fold_batch_norms: whether to fold them.
        preprocessing: the input's `contract.Preprocessing`.
        normalization: the training model's normalisation layer.
        class_names, top_k: what each answer names and lists.
        precisions: {format: the precisions written in it}.
        pixels: uint8 calibration images [count, H, W, C] for int8, or None.
        answer: the answer's facts as the ONNX models record them (`contract.answer_fields`).
    """

    path: str
    trained: keras.Model
    network: keras.Model
    fold_batch_norms: bool
    preprocessing: Preprocessing
    normalization: keras.layers.Layer
    class_names: list
    top_k: int
    precisions: dict
    pixels: np.ndarray
    answer: str

    @functools.cached_property
    def separated(self):
        """The exported network with units in loops written as the same units, one layer each,
        with the same weights: tf2onnx has no ONNX, and LiteRT no builtin operation, for the
        TensorLists of a `keras.ops.scan` loop (`scan_units`)."""
        return inference_network(keras_preact.separate_units(self.trained), self.fold_batch_norms)


def export_saved_model(
    network,
    directory,
    class_names,
    preprocessing,
    *,
    version=None,
    top_k=DEFAULT_TOP_K,
    metadata=None,
    normalization=None,
    formats=("saved_model",),
    fold_batch_norms=True,
    precisions=("float32",),
    calibration_images=None,
    verbose=True,
):
    """Writes `network` as the version folder `<directory>/<version>/`: its formats and metadata.

    Args:
        network: a Keras classifier from normalised images to logits or probabilities
            (a keras-preact network, any `classifier_activation` of softmax or None).
        directory: the model's folder, e.g. "saved_models/resnet110"; its base name is the
            model name TF Serving serves.
        class_names: one name per output, in the order of the classifier.
        preprocessing: a `Preprocessing`: image size, channels, normalisation, crop.
        version: a positive integer; default: one more than the highest in `directory`.
        top_k: how many classes and scores each prediction lists (at most all classes).
        metadata: more JSON-serialisable facts for `metadata.json` (training config, ...).
        normalization: the training model's normalisation layer (default: from `preprocessing`).
        formats: names of `export.FORMATS` to write: "saved_model", "onnx", "litert".
        fold_batch_norms: export the network with its BatchNorms folded into the
            convolutions before them (`keras_preact.fold_batch_norms`), in every format.
        precisions: "float32" and the quantized precisions to write beside it in the formats
            that offer them (`Format.precisions`): "float16" (LiteRT), "int8" (ONNX, LiteRT).
        calibration_images: for int8, files, folders of them, or uint8 pixels [count, H, W,
            C] of the network's size (`export.calibration`): a few hundred training images.
        verbose: print where the model went and how long it took.

    Returns:
        The path of the version folder.

    Raises:
        ValueError: for class names that do not match the classifier, a bad version or
            top_k, an input shape that is not the preprocessing's, a precision none of
            `formats` offers, or int8 without calibration images of the network's size.
        FileExistsError: if the version exists (TF Serving may be serving it).
        ImportError: naming the extra, where a format's packages are missing.
    """
    started, class_names, formats = time.perf_counter(), [str(name) for name in class_names], tuple(formats)
    check_network(network, class_names, preprocessing, top_k, directory)
    written = checked_precisions(formats, precisions)
    pixels = calibration.calibration_pixels(calibration_images, preprocessing.shape) if "int8" in precisions else None
    version = checked_version(directory, version)
    answer = dict(
        class_names=class_names,
        input=dict(dataclasses.asdict(preprocessing), pixel_range=[0, 255]),
        top_k=min(top_k, len(class_names)),
    )
    exported = Version(
        path=os.path.join(directory, f".partial-{version}"),
        trained=network,
        network=inference_network(network, fold_batch_norms),
        fold_batch_norms=fold_batch_norms,
        preprocessing=preprocessing,
        normalization=normalization or normalization_layer(preprocessing),
        class_names=class_names,
        top_k=answer["top_k"],
        precisions=written,
        pixels=pixels,
        answer=contract.answer_fields(answer),
    )
    path = os.path.join(directory, str(version))
    description = write_version(exported, formats, path, dict(version=version, **answer), metadata)
    if verbose:
        seconds, megabytes = time.perf_counter() - started, directory_megabytes(path)
        print(
            f"Exported {exported.network.name} to {path} ({contents(formats, written, description)}) in "
            f"{seconds:.1f} s ({megabytes:.1f} MB)."
        )
    return path


def checked_version(directory, version):
    """`version`, or one more than the highest in `directory` for None, checked to be new.

    Raises:
        ValueError: for a version that is not a positive int64.
        FileExistsError: for a version that exists (TF Serving may be serving it).
    """
    version = next_version(directory) if version is None else version
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= contract.MAXIMUM_VERSION:
        raise ValueError(
            f"version must be a positive integer up to 2**63 - 1 (TF Serving's versions are int64). "
            f"Received: version={version!r}"
        )
    if os.path.exists(os.path.join(directory, str(version))):
        raise FileExistsError(
            f"{os.path.join(directory, str(version))} exists; choose another version (TF Serving serves the "
            f"highest). Received: version={version}"
        )
    return version


def write_version(exported, formats, path, facts, metadata):
    """Writes every format of `exported` (a `Version`) into its folder, then metadata.json
    (the answer's and the version's `facts`, each format's files, `metadata`), and renames the
    folder to `path`; a failure leaves nothing. Returns metadata.json's contents."""
    directory = os.path.dirname(path)
    checked_files.make_directory(directory, "model folder")
    shutil.rmtree(exported.path, ignore_errors=True)
    try:
        os.makedirs(exported.path)
        described_files = {}
        for name in formats:
            described_files.update(FORMATS[name].write(exported))
        description = dict(
            name=os.path.basename(os.path.normpath(directory)),
            **facts,
            signatures={
                name: signature.describe(exported.preprocessing.shape)
                for name, signature in contract.SIGNATURES.items()
            },
            outputs=list(contract.OUTPUTS),
            network=exported.network.name,
            formats=list(formats),
            folded_batch_norms=getattr(exported.network, "folded_batch_norms", 0),
            exported=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            versions=dict(
                keras=keras.__version__,
                tensorflow=tf.__version__,
                **{package: number for name in formats for package, number in FORMATS[name].package_versions().items()},
            ),
            **described_files,
            **(metadata or {}),
        )
        with open(os.path.join(exported.path, contract.METADATA_FILE), "w") as file:
            json.dump(description, file, indent=2)
        os.rename(exported.path, path)
    except BaseException:
        shutil.rmtree(exported.path, ignore_errors=True)
        raise
    return description


def check_network(network, class_names, preprocessing, top_k, directory):
    """Raises ValueError where the network, its class names, input or top_k, or the folder's
    name cannot make a version folder."""
    classes = network.output_shape[-1]
    if len(class_names) != classes:
        raise ValueError(
            f"class_names needs one name per output of the network ({classes}). Received: {len(class_names)} names"
        )
    if tuple(network.input_shape[1:]) != preprocessing.shape:
        raise ValueError(
            f"The network's input shape {tuple(network.input_shape[1:])} differs from the "
            f"preprocessing's {preprocessing.shape}."
        )
    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive integer. Received: top_k={top_k!r}")
    if not os.fspath(directory).isprintable() or not utf8(os.fspath(directory)):
        raise ValueError(
            "directory must be a path of printable UTF-8 characters (TensorFlow's file system names "
            f"files in UTF-8). Received: directory={os.fspath(directory)!r}"
        )


def contents(formats, written, description):
    """What a version folder holds, in words: "a SavedModel, ONNX (float32, int8) and LiteRT,
    10 BatchNorms folded"."""
    kinds = [
        FORMATS[name].title + (f" ({', '.join(written[name])})" if len(written[name]) > 1 else "") for name in formats
    ]
    kinds = " and ".join([", ".join(kinds[:-1]), kinds[-1]] if len(kinds) > 1 else kinds)
    folded = description["folded_batch_norms"] if any(FORMATS[name].folded for name in formats) else 0
    return kinds + (f", {folded} BatchNorms folded" if folded else "")


def checked_precisions(formats, precisions):
    """{format: the precisions written in it} for `precisions` (float32 always among them),
    each format checked to be one and its packages to be installed.

    Raises:
        ValueError: for an unknown format or precision, or a quantized one that none of
            `formats` offers.
        ImportError: naming the extra, where a format's packages are missing.
    """
    if not formats or not set(formats) <= set(FORMATS):
        raise ValueError(f"formats must name some of {list(FORMATS)}. Received: formats={formats!r}")
    for name in formats:
        FORMATS[name].require()
    precisions = tuple(precisions)
    offered = {name: exported.precisions for name, exported in FORMATS.items()}
    known = sorted({precision for precisions_of in offered.values() for precision in precisions_of})
    if not set(precisions) <= set(known):
        raise ValueError(f"precisions must be some of {known}. Received: precisions={precisions!r}")
    for precision in precisions:
        if not any(precision in offered[name] for name in formats):
            have = "; ".join(f"{name}: {', '.join(offered[name])}" for name in formats)
            where = [name for name in offered if precision in offered[name]]
            raise ValueError(
                f"No format exported offers {precision} ({have}); {precision} is written for "
                f"{' and '.join(where)} (--format {where[0]} or all). Received: precision {precision!r}"
            )
    return {
        name: tuple(precision for precision in offered[name] if precision == "float32" or precision in precisions)
        for name in formats
    }


def next_version(directory):
    return 1 + max(versions(directory), default=0)


def directory_megabytes(path):
    return sum(os.path.getsize(os.path.join(root, file)) for root, _, files in os.walk(path) for file in files) / 2**20


def utf8(text):
    """Whether `text` encodes as UTF-8 (a path of undecodable bytes holds lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def checked_name(name):
    """`name` if it is one folder name (`MODEL_NAME`), which keeps an export inside its output folder.

    Raises:
        ValueError: for a name with a path separator, "..", a leading "." or another character.
    """
    if not isinstance(name, str) or not MODEL_NAME.fullmatch(name):
        raise ValueError(
            "name must be one folder name of letters, digits, '_', '-' and '.', not starting with "
            f"'.' (it is the model's folder under the output). Received: name={name!r}"
        )
    return name
