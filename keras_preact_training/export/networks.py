"""The network as the export formats compute it: BatchNorms folded, logits from a softmax
classifier, an array signature as a Keras model, the normalisation of training."""

import keras
import numpy as np
import tensorflow as tf

import keras_preact

from ..train import recipe


def normalization_layer(preprocessing):
    """The training model's normalisation layer (`keras_preact_training.train.recipe.normalization`) of a
    `contract.Preprocessing`."""
    layer = recipe.normalization(preprocessing.normalization_mean, preprocessing.normalization_std)
    layer.build((None, *preprocessing.shape))
    return layer


def normalization_constants(normalization):
    """The mean and variance of a `keras.layers.Normalization`, as float32 NumPy arrays."""
    return (
        keras.ops.convert_to_numpy(value).astype(np.float32) for value in (normalization.mean, normalization.variance)
    )


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


def inference_network(network, fold_batch_norms):
    """The network to export: with its BatchNorms folded (`keras_preact.fold_batch_norms`) if
    asked and its layers form a chain, as every keras-preact network's do; another Keras
    classifier as it is."""
    if fold_batch_norms and keras_preact.walks.is_chain(network):
        return keras_preact.fold_batch_norms(network)
    return network


def input_spec(signature, image_shape):
    """The `tf.TensorSpec` of a `contract.Signature`'s input."""
    return tf.TensorSpec(signature.shape(image_shape), tf.as_dtype(signature.dtype), name=signature.key)


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
