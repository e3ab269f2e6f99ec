"""The SavedModel format: the version folder as TF Serving loads it, with Keras 3's
`keras.export.ExportArchive` and the three signatures of `contract`, which share one traced
network. Encoded images are decoded, resized or cropped and normalised inside the graph with
the functions and layers of training (`data.input_tensorflow.decode_encoded`,
`train.recipe.normalization`). Every signature returns `logits`, `probabilities`,
`class_ids` (the arg max), and the top-k `classes` (names, stored in the graph) with their
`scores`. And the SavedModel read back: its classes of encoded images."""

import functools
import os

from . import Format, contract, register

# The files with which a version folder holds a SavedModel.
FILES = ("saved_model.pb", os.path.join("variables", "variables.index"))


def write(version):
    """Writes the SavedModel of `version` (an `export.versions.Version`) into its folder."""
    import keras
    import tensorflow as tf

    from ..data import input_tensorflow
    from .networks import input_spec, logits_function

    preprocessing, normalization = version.preprocessing, version.normalization
    logits_of = logits_function(version.network)
    names = tf.constant(version.class_names)

    # One traced network behind the three signatures: a deep net is traced once, not thrice.
    @tf.function(input_signature=[tf.TensorSpec((None, *preprocessing.shape), tf.float32)])
    def predict(normalized):
        logits = tf.cast(logits_of(normalized), tf.float32)
        probabilities = tf.nn.softmax(logits)
        scores, indices = tf.math.top_k(probabilities, k=version.top_k)
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
            functools.partial(input_tensorflow.decode_encoded, preprocessing),
            images,
            fn_output_signature=tf.TensorSpec(preprocessing.shape),
        )
        return from_pixels(pixels)

    def predict_pixels(pixels):
        return from_pixels(tf.cast(pixels, tf.float32))

    archive = keras.export.ExportArchive()
    archive.track(version.network)
    archive.track(normalization)
    functions = dict(serving_default=serving_default, predict_pixels=predict_pixels, predict_normalized=predict)
    for name, signature in contract.SIGNATURES.items():
        archive.add_endpoint(name, functions[name], [input_spec(signature, preprocessing.shape)])
    archive.write_out(version.path, verbose=False)
    return {}


register(
    Format(
        name="saved_model",
        title="a SavedModel",
        files_name="a SavedModel",
        precisions=("float32",),
        write=write,
        needed=lambda precision: FILES,
        written=lambda metadata: list(FILES),
        runtime="tensorflow",
        checked_by="TensorFlow, reloaded",
    )
)


def read_image_files(paths):
    """The bytes of image files, each checked to decode.

    Raises:
        FileNotFoundError: for a missing file.
        ValueError: for a file that is not an image TensorFlow decodes (named).
    """
    import tensorflow as tf

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


def predict_encoded(version_path, encoded_images):
    """The reloaded SavedModel's `serving_default` outputs for encoded images, as NumPy."""
    import tensorflow as tf

    signature = tf.saved_model.load(version_path).signatures["serving_default"]
    return {name: value.numpy() for name, value in signature(images=tf.constant(encoded_images)).items()}


def classify(version_path, encoded_images):
    """The reloaded SavedModel's top classes of encoded images: per image [(class, score), ...]."""
    outputs = predict_encoded(version_path, encoded_images)
    return [
        [(name.decode(), float(score)) for name, score in zip(classes, scores)]
        for classes, scores in zip(outputs["classes"], outputs["scores"])
    ]
