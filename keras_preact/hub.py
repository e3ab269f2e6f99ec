"""keras-preact's networks as KerasHub models: a backbone, an image converter, a preprocessor
and an image classifier, the classes a KerasHub preset of a keras-preact network names, so
that `keras_hub.models.ImageClassifier.from_preset("./preset")` and
`keras_hub.models.Backbone.from_preset(...)` load one (offline, from a local folder) once
`keras_preact` is imported; and `image_classifier`, which makes one of any keras-preact
classifier for `save_to_preset`.

The backbone is the network without its classifier: normalised images in, the last unit's
activations (after the final BatchNorm and ReLU, before pooling) out, the network itself
nested inside it and serialised whole in its config, so any network of the library (every
unit, shortcut and merge of the paper) loads. The classifier is KerasHub's own head, global
average pooling and a Dense layer, which is the network's own; the preprocessor's image
converter normalises 0-255 pixels with the network's statistics (`x * scale + offset`, scale
1 / std, offset -mean / std), so the classifier takes pixels as
`include_preprocessing=True` does. Only KerasHub's public API: `Backbone`, `ImageClassifier`,
`ImageClassifierPreprocessor` and `ImageConverter` subclassed, as KerasHub's own models do.

Imported when KerasHub is (a post-import hook of `keras_preact`): its classes register
with Keras under the package "keras_preact".
"""

import keras

try:
    import keras_hub
except ImportError:
    raise ImportError(
        'keras_preact.hub needs KerasHub, which is not installed: pip install "keras-preact[hub]"'
    ) from None


@keras.saving.register_keras_serializable(package="keras_preact")
class PreActResNetBackbone(keras_hub.models.Backbone):
    """A keras-preact network without its classifier, as a KerasHub backbone.

    Args:
        network: the feature network (a Keras model from normalised images to the last
            unit's activations: `keras_preact.get_model(..., include_top=False)`, or a
            classifier's layers up to its pooling), or its serialised form.
        dtype: KerasHub's dtype of the backbone's own layers.
    """

    def __init__(self, network, dtype=None, **kwargs):
        if isinstance(network, dict):
            network = keras.saving.deserialize_keras_object(network)
        if not isinstance(network, keras.Model) or len(network.output_shape) != 4:
            raise ValueError(
                "network must be a keras-preact network without its classifier (images in, a feature map "
                f"out). Received: {type(network).__name__} with output shape "
                f"{getattr(network, 'output_shape', None)}"
            )
        inputs = keras.Input(shape=network.input_shape[1:], name="images")
        outputs = network(inputs)
        super().__init__(inputs=inputs, outputs=outputs, dtype=dtype, **kwargs)
        self.network = network

    def get_config(self):
        config = super().get_config()
        config["network"] = keras.saving.serialize_keras_object(self.network)
        return config


@keras.saving.register_keras_serializable(package="keras_preact")
class PreActResNetImageConverter(keras_hub.layers.ImageConverter):
    """Pixels (0-255) of the network's size, normalised as the network trained."""

    backbone_cls = PreActResNetBackbone


@keras.saving.register_keras_serializable(package="keras_preact")
class PreActResNetImageClassifierPreprocessor(keras_hub.models.ImageClassifierPreprocessor):
    backbone_cls = PreActResNetBackbone
    image_converter_cls = PreActResNetImageConverter


@keras.saving.register_keras_serializable(package="keras_preact")
class PreActResNetImageClassifier(keras_hub.models.ImageClassifier):
    """A keras-preact classifier as a KerasHub `ImageClassifier`: 0-255 pixels in (its
    preprocessor), probabilities out."""

    backbone_cls = PreActResNetBackbone
    preprocessor_cls = PreActResNetImageClassifierPreprocessor


def image_classifier(network, mean, std):
    """The KerasHub classifier of a keras-preact classifier `network` (normalised images in, its
    last layer a Dense classifier after global average pooling) whose images are normalised
    with the per-channel `mean` and `std` (0-255 scale): the same weights, the same
    probabilities of the same pixels.

    Raises:
        ValueError: for a network that does not end in global average pooling and a Dense layer.
    """
    pooling, classifier = (network.layers[-2:] + [None, None])[:2] if len(network.layers) >= 2 else (None, None)
    if not isinstance(pooling, keras.layers.GlobalAveragePooling2D) or not isinstance(classifier, keras.layers.Dense):
        raise ValueError(
            "network must be a keras-preact classifier (include_top=True: global average pooling, then a Dense "
            f"layer). Received: a network ending in {type(pooling).__name__}, {type(classifier).__name__}"
        )
    channels = network.input_shape[-1]
    mean, std = [float(value) for value in mean], [float(value) for value in std]
    mean, std = (mean * channels if len(mean) == 1 else mean), (std * channels if len(std) == 1 else std)
    features = keras.Model(network.input, pooling.input, name=f"{network.name}_features")
    backbone = PreActResNetBackbone(
        keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(features))
    )
    backbone.network.set_weights(features.get_weights())
    converter = PreActResNetImageConverter(
        image_size=tuple(network.input_shape[1:3]),
        scale=[1.0 / value for value in std],
        offset=[-average / value for average, value in zip(mean, std)],
    )
    result = PreActResNetImageClassifier(
        backbone=backbone,
        num_classes=classifier.units,
        preprocessor=PreActResNetImageClassifierPreprocessor(image_converter=converter),
        activation="softmax",
    )
    result.output_dense.set_weights(classifier.get_weights())
    return result


# The files of a KerasHub classifier preset: what `save_to_preset` writes and `from_preset` reads.
PRESET_FILES = (
    "task.json",
    "config.json",
    "metadata.json",
    "model.weights.h5",
    "task.weights.h5",
    "preprocessor.json",
    "image_converter.json",
)


def from_preset(directory):
    """The classifier of a preset of a keras-preact network in the local `directory`
    (`keras_hub.models.ImageClassifier.from_preset` of it, offline).

    Raises:
        ValueError: in one line, for a directory that is not a preset of a keras-preact classifier.
    """
    import json
    import os

    path = os.path.join(directory, "task.json")
    try:
        with open(path) as file:
            name = json.load(file).get("registered_name")
    except (OSError, ValueError, AttributeError):
        name = None
    if name != keras.saving.get_registered_name(PreActResNetImageClassifier):
        raise ValueError(
            f"{directory} is not a KerasHub preset of a keras-preact classifier (its task.json names "
            f"{name!r}; `keras-preact export --format kerashub` writes one). Received: directory={directory!r}"
        )
    # A local folder whose name is also a built-in preset's is looked up on Kaggle unless it reads as a path.
    return keras_hub.models.ImageClassifier.from_preset(os.path.abspath(directory))
