"""Export networks as SavedModels that TF Serving loads as they are.

`export_saved_model` writes `<directory>/<version>/`, the versioned layout of TF Serving
(`saved_models/<name>/<version>/` by default), with Keras 3's `keras.export.ExportArchive`
and the three signatures of `keras_preact_training.export.contract`, which share one traced network. Encoded
images are decoded, resized or cropped and normalised inside the graph with the functions
and layers of training (`keras_preact_training.data.datasets`, `keras_preact_training.train.recipe`). Every signature returns
`logits`, `probabilities`, `class_ids` (the arg max), and the top-k `classes` (names,
stored in the graph) with their `scores`. `metadata.json` beside
`saved_model.pb` records the model, the class names, the input and its preprocessing,
the training config and the final test error.

By default the exported graph is the network with its BatchNorms folded into the
convolutions before them (`keras_preact.fold_batch_norms`): the same outputs to float32
rounding, fewer operations per image. `fold_batch_norms=False` exports it as it trains.

Beside the SavedModel (or instead of it, `formats`), the pixel signatures go out as ONNX
models (`export_onnx`, int8 ones beside them: `keras_preact_training.export.onnx_quantization`) and
`predict_pixels` as LiteRT models (`keras_preact_training.export.litert`), each precision recorded in
metadata.json with its file and SHA-256 (`contract.PRECISIONS`).
"""

import dataclasses
import datetime
import functools
import json
import os
import shutil
import time
import warnings

import keras
import numpy as np
import tensorflow as tf

import keras_preact
from keras_preact import checksums, pretrained

from .. import files
from ..data import datasets, input_tensorflow
from ..defaults import DEFAULT_DIRECTORY, DEFAULT_TOP_K, EXPORT_FORMATS, ONNX_EXTRA
from ..train import configs, recipe
from . import calibration, contract, litert
from .contract import MODEL_NAME, PRECISIONS, Preprocessing, versions

# What `--format` writes into a version folder: the SavedModel, ONNX models, LiteRT models, or all.
FORMATS = {
    "saved_model": ("saved_model",),
    "onnx": ("onnx",),
    "litert": ("litert",),
    "all": ("saved_model", "onnx", "litert"),
}
assert tuple(FORMATS) == EXPORT_FORMATS
# What each format's files are called in messages.
FORMAT_NAMES = {"saved_model": "a SavedModel", "onnx": "ONNX", "litert": "LiteRT"}
# The largest difference of logits, relative to their largest magnitude, between an
# exported ONNX model under onnxruntime and the network: float32 rounding only.
ONNX_TOLERANCE = 1e-4
# How encoded images reach the network's size (`contract.CROPS`), as in training.
CROP_FUNCTIONS = {"resize": input_tensorflow.resize, "central_crop": input_tensorflow.central_crop}


def normalization_layer(preprocessing):
    """The training model's normalisation layer (`keras_preact_training.train.recipe.normalization`) of a
    `contract.Preprocessing`."""
    layer = recipe.normalization(preprocessing.normalization_mean, preprocessing.normalization_std)
    layer.build((None, *preprocessing.shape))
    return layer


def decode(preprocessing, encoded):
    """Encoded bytes -> float32 pixels (0-255) of the network's size, as `keras_preact_training.data.input_tensorflow`.

    JPEG and PNG decoders convert to `channels` themselves (`input_tensorflow.decode_image`); GIF and
    BMP decode to their own channels (GIF: RGB; BMP: grey, RGB or RGBA), converted here:
    alpha dropped, grey repeated to RGB, RGB to grey with `tf.image.rgb_to_grayscale`'s
    weights."""
    own_channels = tf.logical_or(
        tf.equal(tf.strings.substr(encoded, 0, 3), b"GIF"), tf.equal(tf.strings.substr(encoded, 0, 2), b"BM")
    )
    image = tf.cond(
        own_channels,
        lambda: to_channels(tf.io.decode_image(encoded, expand_animations=False), preprocessing.channels),
        lambda: input_tensorflow.decode_image(encoded, preprocessing.channels),
    )
    return tf.ensure_shape(CROP_FUNCTIONS[preprocessing.crop](image, preprocessing.image_size), preprocessing.shape)


def to_channels(image, channels):
    """uint8 pixels [height, width, 1 to 4 channels] as 1 (grey) or 3 (RGB) channels."""
    have = tf.shape(image)[-1]
    rgb = tf.cond(have >= 3, lambda: image[..., :3], lambda: tf.image.grayscale_to_rgb(image[..., :1]))
    if channels == 3:
        return rgb
    return tf.cond(have >= 3, lambda: tf.image.rgb_to_grayscale(rgb), lambda: image[..., :1])


def logits_function(network):
    """x -> logits of a classifier whose last layer is a Dense with softmax or no activation.

    keras-preact's networks end in softmax by default (Keras Applications); the logits
    are then the classifier's pre-activation, computed with its own kernel and bias.
    """
    classifier = network.layers[-1] if network.layers else None
    if not isinstance(classifier, keras.layers.Dense):
        raise ValueError(
            "export needs a classifier whose last layer is a Dense layer (include_top=True). "
            f"Received: a model whose last layer is {type(classifier).__name__}"
        )
    activation = keras.activations.serialize(classifier.activation)
    if activation == "linear":
        return network
    if activation != "softmax":
        raise ValueError(
            "The classifier's activation must be softmax or None (logits). "
            f"Received: classifier activation {activation!r}"
        )
    features = keras.Model(network.input, classifier.input)
    return lambda images: tf.matmul(features(images), classifier.kernel) + classifier.bias


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
    """Writes `network` as the SavedModel `<directory>/<version>/` and its metadata.

    Args:
        network: a Keras classifier from normalised images to logits or probabilities
            (a keras-preact network, any `classifier_activation` of softmax or None).
        directory: the model's folder, e.g. "saved_models/resnet110"; its base name is the
            model name TF Serving serves.
        class_names: one name per output, in the order of the classifier.
        preprocessing: a `Preprocessing`: image size, channels, normalisation, crop.
        version: a positive integer; default: one more than the highest in `directory`.
        top_k: how many classes and scores each prediction lists (at most all classes).
        metadata: more JSON-serialisable facts for `metadata.json` (training config,
            test error, ...).
        normalization: the training model's own normalisation layer, if there is one;
            default: a new one from `preprocessing`.
        formats: what to write: "saved_model", "onnx" (`export_onnx`: the pixel
            signatures as ONNX models under `<version>/onnx/`, checked with onnxruntime)
            and/or "litert" (`predict_pixels` as LiteRT models under `<version>/litert/`,
            checked with LiteRT's interpreter).
        fold_batch_norms: export the network with its BatchNorms folded into the
            convolutions before them (`keras_preact.fold_batch_norms`), in every format,
            where its layers form a chain (every keras-preact network).
        precisions: "float32" and the quantized precisions to write beside it, each in the
            formats that offer it (`contract.PRECISIONS`): "float16" (LiteRT) and "int8"
            (ONNX and LiteRT). Each must be offered by one of `formats`.
        calibration_images: for int8, the images that calibrate it: files, folders of them,
            or uint8 pixels [count, H, W, C], of the network's size
            (`keras_preact_training.export.calibration`); a few hundred training images.
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
    started = time.perf_counter()
    class_names = [str(name) for name in class_names]
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
    formats = tuple(formats)
    if not formats or not set(formats) <= set(PRECISIONS):
        raise ValueError(f"formats must name some of {list(PRECISIONS)}. Received: formats={formats!r}")
    written = checked_precisions(formats, precisions)
    if "onnx" in formats:
        require_onnx()
    if "litert" in formats:
        litert.require_litert()
    pixels = calibration.calibration_pixels(calibration_images, preprocessing.shape) if "int8" in precisions else None
    version = next_version(directory) if version is None else version
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= contract.MAXIMUM_VERSION:
        raise ValueError(
            f"version must be a positive integer up to 2**63 - 1 (TF Serving's versions are int64). "
            f"Received: version={version!r}"
        )
    path = os.path.join(directory, str(version))
    if os.path.exists(path):
        raise FileExistsError(
            f"{path} exists; choose another version (TF Serving serves the highest). Received: version={version}"
        )

    normalization = normalization or normalization_layer(preprocessing)
    trained = network
    network = inference_network(network, fold_batch_norms)
    logits_of = logits_function(network)
    names = tf.constant(class_names)
    top_k = min(top_k, classes)

    # One traced network behind the three signatures: a deep net is traced once, not thrice.
    @tf.function(input_signature=[tf.TensorSpec((None, *preprocessing.shape), tf.float32)])
    def predict(normalized):
        logits = tf.cast(logits_of(normalized), tf.float32)
        probabilities = tf.nn.softmax(logits)
        scores, indices = tf.math.top_k(probabilities, k=top_k)
        return dict(
            logits=logits,
            probabilities=probabilities,
            class_ids=tf.argmax(logits, axis=-1),
            classes=tf.gather(names, indices),
            scores=scores,
        )

    def from_pixels(pixels):
        return predict(tf.cast(normalization(pixels), tf.float32))

    def serving_default(images):
        pixels = tf.map_fn(
            functools.partial(decode, preprocessing), images, fn_output_signature=tf.TensorSpec(preprocessing.shape)
        )
        return from_pixels(pixels)

    def predict_pixels(pixels):
        return from_pixels(tf.cast(pixels, tf.float32))

    archive = keras.export.ExportArchive()
    archive.track(network)
    archive.track(normalization)
    functions = dict(serving_default=serving_default, predict_pixels=predict_pixels, predict_normalized=predict)
    for name, signature in contract.SIGNATURES.items():
        archive.add_endpoint(name, functions[name], [input_spec(signature, preprocessing.shape)])

    # Written beside the final folder and renamed: TF Serving, polling `directory`, never
    # sees a half-written version, and a failed export leaves nothing behind.
    partial = os.path.join(directory, f".partial-{version}")
    files.make_directory(directory, "model folder")
    shutil.rmtree(partial, ignore_errors=True)
    answer = dict(
        class_names=class_names, input=dict(dataclasses.asdict(preprocessing), pixel_range=[0, 255]), top_k=top_k
    )
    try:
        described_files = write_version(
            partial,
            archive,
            trained,
            preprocessing,
            normalization,
            fold_batch_norms,
            formats,
            written,
            pixels,
            contract.answer_fields(answer),
        )
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    description = dict(
        name=os.path.basename(os.path.normpath(directory)),
        version=version,
        **answer,
        signatures={name: signature.describe(preprocessing.shape) for name, signature in contract.SIGNATURES.items()},
        outputs=list(contract.OUTPUTS),
        network=network.name,
        formats=list(formats),
        folded_batch_norms=getattr(network, "folded_batch_norms", 0),
        exported=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        versions=dict(keras=keras.__version__, tensorflow=tf.__version__, **export_versions(formats)),
        **described_files,
        **(metadata or {}),
    )
    try:
        with open(os.path.join(partial, contract.METADATA_FILE), "w") as file:
            json.dump(description, file, indent=2)
        os.rename(partial, path)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if verbose:
        kinds = [
            FORMAT_NAMES[kind] + (f" ({', '.join(written[kind])})" if len(written[kind]) > 1 else "")
            for kind in formats
        ]
        kinds = " and ".join([", ".join(kinds[:-1]), kinds[-1]] if len(kinds) > 1 else kinds)
        folded = f", {description['folded_batch_norms']} BatchNorms folded" if description["folded_batch_norms"] else ""
        print(
            f"Exported {network.name} to {path} ({kinds}{folded}) in {time.perf_counter() - started:.1f} s "
            f"({directory_megabytes(path):.1f} MB)."
        )
    return path


def checked_precisions(formats, precisions):
    """{format: the precisions written in it} for `precisions` (float32 always among them).

    Raises:
        ValueError: for an unknown precision, or a quantized one that none of `formats` offers.
    """
    precisions = tuple(precisions)
    known = sorted({precision for offered in PRECISIONS.values() for precision in offered})
    if not set(precisions) <= set(known):
        raise ValueError(f"precisions must be some of {known}. Received: precisions={precisions!r}")
    for precision in precisions:
        if not any(precision in PRECISIONS[kind] for kind in formats):
            offered = "; ".join(f"{kind}: {', '.join(PRECISIONS[kind])}" for kind in formats)
            where = [kind for kind in PRECISIONS if precision in PRECISIONS[kind]]
            raise ValueError(
                f"No format exported offers {precision} ({offered}); {precision} is written for "
                f"{' and '.join(where)} (--format {where[0]} or all). Received: precision {precision!r}"
            )
    return {
        kind: tuple(precision for precision in PRECISIONS[kind] if precision == "float32" or precision in precisions)
        for kind in formats
    }


def write_version(
    partial, archive, trained, preprocessing, normalization, fold_batch_norms, formats, written, pixels, answer
):
    """Writes every format of one version into the folder `partial`, each ONNX model recording
    `answer` (`contract.answer_fields`); returns what metadata.json records of the ONNX and
    LiteRT files (`contract.onnx_models`)."""
    if "saved_model" in formats:
        archive.write_out(partial, verbose=False)
    else:
        os.makedirs(partial)
    if not {"onnx", "litert"} & set(formats):
        return {}
    # tf2onnx has no ONNX, and LiteRT no builtin operation, for the TensorLists of a
    # `keras.ops.scan` loop: units in loops (`scan_units`) are written as the same units, one
    # layer each, with the same weights.
    separated = inference_network(keras_preact.separate_units(trained), fold_batch_norms)
    described = {}
    if "onnx" in formats:
        onnx_files = export_onnx(separated, partial, preprocessing, normalization)
        record_answer(partial, onnx_files, answer)
        described["onnx"] = dict(
            files=onnx_files, outputs=list(contract.ONNX_OUTPUTS), sha256=digests(partial, onnx_files)
        )
        if "int8" in written["onnx"]:
            from .onnx_quantization import quantize_onnx

            int8_files = quantize_onnx(
                partial, onnx_files, pixels, lambda images: normalization(images.astype(np.float32))
            )
            record_answer(partial, int8_files, answer)
            described["onnx"]["quantized"] = dict(
                int8=dict(
                    files=int8_files,
                    sha256=digests(partial, int8_files),
                    calibration_images=len(pixels),
                    settings=contract.ONNX_INT8_SETTINGS,
                )
            )
    if "litert" in formats:
        pixel_model = SignatureModel(separated, *normalization_constants(normalization))
        litert_files = litert.export_litert(pixel_model, partial, preprocessing.shape, written["litert"], pixels)
        described["litert"] = dict(
            signature=contract.LITERT_SIGNATURE,
            input=contract.SIGNATURES[contract.LITERT_SIGNATURE].describe(preprocessing.shape),
            output=contract.LITERT_OUTPUT,
            files=litert_files,
            sha256=digests(partial, litert_files),
            **(dict(calibration_images=len(pixels)) if "int8" in litert_files else {}),
        )
    return described


def record_answer(path, relative_files, answer):
    """Records `answer` (`contract.answer_fields`) under `contract.ONNX_ANSWER_KEY` in the
    metadata_props of each ONNX model in `relative_files` ({signature: path relative to `path`})."""
    import onnx

    for file in relative_files.values():
        model = onnx.load(os.path.join(path, file))
        properties = {entry.key: entry.value for entry in model.metadata_props}
        onnx.helper.set_model_props(model, {**properties, contract.ONNX_ANSWER_KEY: answer})
        onnx.save(model, os.path.join(path, file))


def digests(path, relative_files):
    """{key: SHA-256} of files relative to `path`."""
    return {key: checksums.sha256(os.path.join(path, file)) for key, file in relative_files.items()}


def input_spec(signature, image_shape):
    """The `tf.TensorSpec` of a `contract.Signature`'s input."""
    return tf.TensorSpec(signature.shape(image_shape), tf.as_dtype(signature.dtype), name=signature.key)


def inference_network(network, fold_batch_norms):
    """The network to export: with its BatchNorms folded (`keras_preact.fold_batch_norms`) if
    asked and its layers form a chain, as every keras-preact network's do; another Keras
    classifier as it is."""
    if fold_batch_norms and keras_preact.walks.is_chain(network):
        return keras_preact.fold_batch_norms(network)
    return network


def require_onnx():
    """Raises an ImportError naming the extra when tf2onnx, onnx or onnxruntime is missing."""
    for module in ("onnx", "tf2onnx", "onnxruntime"):
        try:
            __import__(module)
        except ImportError:
            raise ImportError(f"ONNX export needs the onnx extra ({module} is not installed): {ONNX_EXTRA}") from None


def export_versions(formats):
    """The versions of the packages that wrote and checked `formats`' files."""
    versions = {}
    if "onnx" in formats:
        import onnx
        import onnxruntime
        import tf2onnx

        versions.update(onnx=onnx.__version__, tf2onnx=tf2onnx.__version__, onnxruntime=onnxruntime.__version__)
    if "litert" in formats:
        from importlib.metadata import version

        versions["ai_edge_litert"] = version("ai-edge-litert")
    return versions


def normalization_constants(normalization):
    """The mean and variance of a `keras.layers.Normalization`, as float32 NumPy arrays."""
    return (
        keras.ops.convert_to_numpy(value).astype(np.float32) for value in (normalization.mean, normalization.variance)
    )


class SignatureModel(keras.Model):
    """One array signature of the SavedModel as a Keras model, for ONNX and LiteRT export:
    pixels (uint8, normalised inside the graph) or normalised images (float32) to logits,
    probabilities and class ids. The normalisation is `keras.layers.Normalization`'s
    own formula over its mean and variance as constants of the graph."""

    def __init__(self, network, mean=None, variance=None, **kwargs):
        super().__init__(**kwargs)
        self.network, self.logits_of = network, logits_function(network)
        self.mean, self.variance = mean, variance

    def call(self, inputs):
        images = tf.cast(inputs, tf.float32)
        if self.mean is not None:
            images = (images - tf.constant(self.mean)) / tf.maximum(
                tf.sqrt(tf.constant(self.variance)), keras.backend.epsilon()
            )
        logits = tf.cast(self.logits_of(images), tf.float32)
        return dict(logits=logits, probabilities=tf.nn.softmax(logits), class_ids=tf.argmax(logits, axis=-1))


def export_onnx(network, path, preprocessing, normalization):
    """Writes `<path>/onnx/<signature>.onnx` for the image-array signatures (`contract.ONNX_MODELS`) of
    `network` (units in loops separated: `write_version`) with Keras' ONNX export (tf2onnx), then
    runs each with onnxruntime on random pixels against the network: a model whose logits
    differ by more than ONNX_TOLERANCE is an error.

    Returns:
        {signature: file path relative to `path`}.
    """
    import onnxruntime

    mean, variance = normalization_constants(normalization)
    pixels = np.random.default_rng(0).integers(0, 256, size=(4, *preprocessing.shape)).astype(np.uint8)
    os.makedirs(os.path.join(path, contract.ONNX_DIRECTORY), exist_ok=True)
    files = {}
    for signature in (contract.SIGNATURES[name] for name in contract.ONNX_MODELS):
        pixel_input = signature.dtype == "uint8"  # normalised inside the graph
        model = SignatureModel(network, mean, variance) if pixel_input else SignatureModel(network)
        inputs = pixels if pixel_input else keras.ops.convert_to_numpy(normalization(pixels.astype(np.float32)))
        expected = keras.ops.convert_to_numpy(model(inputs)["logits"])  # Keras exports called models only
        files[signature.name] = contract.onnx_file(signature.name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # tf2onnx's use of np.object, patched by Keras
            model.export(
                os.path.join(path, files[signature.name]),
                format="onnx",
                verbose=False,
                input_signature=[input_spec(signature, preprocessing.shape)],
            )
        session = onnxruntime.InferenceSession(
            os.path.join(path, files[signature.name]), providers=["CPUExecutionProvider"]
        )
        logits = session.run(["logits"], {signature.key: inputs.astype(signature.dtype)})[0]
        difference = np.abs(logits - expected).max() / max(np.abs(expected).max(), 1e-6)
        if not difference <= ONNX_TOLERANCE:
            raise ValueError(
                f"The ONNX model {files[signature.name]} computes other logits than the network under "
                f"onnxruntime on random pixels: relative difference {difference:.2g}, where float32 "
                f"rounding stays under {ONNX_TOLERANCE:g} (an untrained deep network can amplify "
                "rounding that much; a trained one does not). Export with --format saved_model."
            )
    return files


def next_version(directory):
    return 1 + max(versions(directory), default=0)


def directory_megabytes(path):
    return sum(os.path.getsize(os.path.join(root, file)) for root, _, files in os.walk(path) for file in files) / 2**20


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
    summary = files.read_json(summary_path, "train the run again, or restore the file")
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


def utf8(text):
    """Whether `text` encodes as UTF-8 (a path of undecodable bytes holds lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_image_files(paths):
    """The bytes of image files, each checked to decode.

    Raises:
        FileNotFoundError: for a missing file.
        ValueError: for a file that is not an image TensorFlow decodes (named).
    """
    encoded = []
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"No image file {path!r}.")
        with open(path, "rb") as file:
            encoded.append(file.read())
        try:
            tf.io.decode_image(encoded[-1], expand_animations=False)
        except tf.errors.InvalidArgumentError as error:
            raise ValueError(
                f"{path} is not a JPEG, PNG, GIF or BMP image TensorFlow decodes: {error.message.splitlines()[0]}"
            ) from None
    return encoded


def classify(version_path, encoded_images):
    """The reloaded SavedModel's top classes of encoded images: per image [(class, score), ...]."""
    outputs = predict_encoded(version_path, encoded_images)
    return [
        [(name.decode(), float(score)) for name, score in zip(classes, scores)]
        for classes, scores in zip(outputs["classes"], outputs["scores"])
    ]


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


def run_config(summary):
    return configs.Config(
        **{field: tuple(value) if isinstance(value, list) else value for field, value in summary["config"].items()}
    )


def example_image(run_dir):
    """(encoded bytes, true class) of the first test image of a run's data set."""
    config = run_config(
        files.read_json(os.path.join(run_dir, "summary.json"), "train the run again, or restore the file")
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


def predict_encoded(version_path, encoded_images):
    """The reloaded SavedModel's `serving_default` outputs for encoded images, as NumPy."""
    signature = tf.saved_model.load(version_path).signatures["serving_default"]
    return {name: value.numpy() for name, value in signature(images=tf.constant(encoded_images)).items()}
