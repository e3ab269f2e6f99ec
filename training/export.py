"""Export networks as SavedModels that TF Serving loads as they are.

`export_saved_model` writes `<directory>/<version>/`, the versioned layout of TF Serving
(`saved_models/<name>/<version>/` by default), with Keras 3's `keras.export.ExportArchive`
and the three signatures of `keras_preact_training.contract`, which share one traced network. Encoded
images are decoded, resized or cropped and normalised inside the graph with the functions
and layers of training (`keras_preact_training.data`, `keras_preact_training.recipe`). Every signature returns
`logits`, `probabilities`, `class_ids` (the arg max), and the top-k `classes` (names,
stored in the graph) with their `scores`. `metadata.json` beside
`saved_model.pb` records the model, the class names, the input and its preprocessing,
the training config and the final test error.

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
import warnings

import keras
import numpy as np
import tensorflow as tf

import keras_preact
from keras_preact import checksums, pretrained

from . import configs, contract, data, files, input_tensorflow, recipe
from .contract import MODEL_NAME, Preprocessing, versions
from .defaults import DEFAULT_DIRECTORY, DEFAULT_TOP_K, EXPORT_FORMATS, ONNX_EXTRA

# What `--format` writes into a version folder: the SavedModel, ONNX models, or both.
FORMATS = {"saved_model": ("saved_model",), "onnx": ("onnx",), "all": ("saved_model", "onnx")}
assert tuple(FORMATS) == EXPORT_FORMATS
# The largest difference of logits, relative to their largest magnitude, between an
# exported ONNX model under onnxruntime and the network: float32 rounding only.
ONNX_TOLERANCE = 1e-4
# How encoded images reach the network's size (`contract.CROPS`), as in training.
CROP_FUNCTIONS = {"resize": input_tensorflow.resize, "central_crop": input_tensorflow.central_crop}


def normalization_layer(preprocessing):
    """The training model's normalisation layer (`keras_preact_training.recipe.normalization`) of a
    `contract.Preprocessing`."""
    layer = recipe.normalization(preprocessing.normalization_mean, preprocessing.normalization_std)
    layer.build((None, *preprocessing.shape))
    return layer


def decode(preprocessing, encoded):
    """Encoded bytes -> float32 pixels (0-255) of the network's size, as `keras_preact_training.input_tensorflow`.

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
        formats: what to write: "saved_model" and/or "onnx" (`export_onnx`: the pixel
            signatures as ONNX models under `<version>/onnx/`, checked with onnxruntime).
        fold_batch_norms: export the network with its BatchNorms folded into the
            convolutions before them (`keras_preact.fold_batch_norms`), in both formats,
            where its layers form a chain (every keras-preact network).
        verbose: print where the model went and how long it took.

    Returns:
        The path of the version folder.

    Raises:
        ValueError: for class names that do not match the classifier, a bad version or
            top_k, or an input shape that is not the preprocessing's.
        FileExistsError: if the version exists (TF Serving may be serving it).
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
    formats = tuple(formats)
    if not formats or not set(formats) <= {"saved_model", "onnx"}:
        raise ValueError(f"formats must name 'saved_model' and/or 'onnx'. Received: formats={formats!r}")
    if "onnx" in formats:
        require_onnx()
    version = next_version(directory) if version is None else version
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"version must be a positive integer. Received: version={version!r}")
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
    # sees a half-written version.
    partial = os.path.join(directory, f".partial-{version}")
    files.make_directory(directory, "model folder")
    shutil.rmtree(partial, ignore_errors=True)
    if "saved_model" in formats:
        archive.write_out(partial, verbose=False)
    else:
        os.makedirs(partial)
    onnx_files = (
        export_onnx(trained, partial, preprocessing, normalization, fold_batch_norms) if "onnx" in formats else {}
    )
    description = dict(
        name=os.path.basename(os.path.normpath(directory)),
        version=version,
        class_names=class_names,
        input=dict(dataclasses.asdict(preprocessing), pixel_range=[0, 255]),
        signatures={name: signature.describe(preprocessing.shape) for name, signature in contract.SIGNATURES.items()},
        outputs=list(contract.OUTPUTS),
        top_k=top_k,
        network=network.name,
        formats=list(formats),
        folded_batch_norms=getattr(network, "folded_batch_norms", 0),
        exported=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        versions=dict(keras=keras.__version__, tensorflow=tf.__version__, **onnx_versions(formats)),
        **(
            dict(
                onnx=dict(
                    files=onnx_files,
                    outputs=list(contract.ONNX_OUTPUTS),
                    sha256={
                        signature: checksums.sha256(os.path.join(partial, file))
                        for signature, file in onnx_files.items()
                    },
                )
            )
            if onnx_files
            else {}
        ),
        **(metadata or {}),
    )
    with open(os.path.join(partial, contract.METADATA_FILE), "w") as file:
        json.dump(description, file, indent=2)
    os.rename(partial, path)
    if verbose:
        written = " and ".join({"saved_model": "a SavedModel", "onnx": "ONNX"}[kind] for kind in formats)
        folded = f", {description['folded_batch_norms']} BatchNorms folded" if description["folded_batch_norms"] else ""
        print(
            f"Exported {network.name} to {path} ({written}{folded}) in {time.perf_counter() - started:.1f} s "
            f"({directory_megabytes(path):.1f} MB)."
        )
    return path


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


def onnx_versions(formats):
    if "onnx" not in formats:
        return {}
    import onnx
    import onnxruntime
    import tf2onnx

    return dict(onnx=onnx.__version__, tf2onnx=tf2onnx.__version__, onnxruntime=onnxruntime.__version__)


class OnnxExportModel(keras.Model):
    """One pixel signature of the SavedModel as a Keras model, for ONNX export: pixels
    (uint8, normalised inside the graph) or normalised images (float32) to logits,
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


def export_onnx(network, path, preprocessing, normalization, fold_batch_norms=True):
    """Writes `<path>/onnx/<signature>.onnx` for the image-array signatures (`contract.ONNX_MODELS`) with
    Keras' ONNX export (tf2onnx), then runs each with onnxruntime on random pixels against
    the network: a model whose logits differ by more than ONNX_TOLERANCE is an error.
    Units in loops are written as separate units (ONNX has no equivalent of the loop),
    with their BatchNorms folded if `fold_batch_norms`.

    Returns:
        {signature: file path relative to `path`}.
    """
    import onnxruntime

    # tf2onnx has no ONNX for the TensorLists of a `keras.ops.scan` loop: units in loops
    # (`scan_units`) are exported as the same units, one layer each, with the same weights.
    network = inference_network(keras_preact.separate_units(network), fold_batch_norms)
    mean, variance = (
        keras.ops.convert_to_numpy(value).astype(np.float32) for value in (normalization.mean, normalization.variance)
    )
    pixels = np.random.default_rng(0).integers(0, 256, size=(4, *preprocessing.shape)).astype(np.uint8)
    os.makedirs(os.path.join(path, contract.ONNX_DIRECTORY), exist_ok=True)
    files = {}
    for signature in (contract.SIGNATURES[name] for name in contract.ONNX_MODELS):
        pixel_input = signature.dtype == "uint8"  # normalised inside the graph
        model = OnnxExportModel(network, mean, variance) if pixel_input else OnnxExportModel(network)
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
):
    """Exports the model a `keras-preact train` run saved, with its run's facts.

    The run's `model.keras` is the training model (augmentation, normalisation, network);
    its normalisation layer and network are exported. The name defaults to
    "<dataset>_<model>".

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
):
    """Exports a network with keras-preact's shipped weights (`keras_preact.pretrained`),
    normalised with its data set's statistics, with the registry's facts in its metadata.
    The name defaults to "<dataset>_<model>", as a run's.

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
        verbose=verbose,
    )


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
    dataset = data.load(dataclasses.replace(config, test_examples=None))
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
