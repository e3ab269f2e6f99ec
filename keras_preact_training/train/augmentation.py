"""The paper's augmentation as Keras layers, the training model's first layers on every backend
(`recipe.preprocessing` composes them): random crops of zero-padded images, and Cutout."""

import keras
from keras import ops

from keras_preact import defaults


@keras.saving.register_keras_serializable(package="keras_preact_training")
class RandomPaddedCrop(keras.layers.Layer):
    """Pads every image by `padding` zero pixels and crops it back at a random offset.

    The paper's CIFAR augmentation (appendix, after [1]): "4 pixels are padded on each
    side, and a 32x32 crop is randomly sampled from the padded image". Each image of a
    batch gets its own offset, uniform over the (2 padding + 1)^2 positions. At
    inference the layer returns its input (the paper tests on the original image).

    Args:
        padding: pixels added on each side (4 in the paper).
        seed: seed of the layer's random generator.
    """

    def __init__(self, padding=4, seed=None, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(padding, int) or padding < 0:
            raise ValueError(f"padding must be an integer >= 0. Received: padding={padding!r}")
        self.padding = padding
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def call(self, images, training=None):
        if not training or self.padding == 0:
            return images
        pad = self.padding
        batch = ops.shape(images)[0]
        height, width, channels = images.shape[1:]
        padded = ops.pad(images, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
        offsets = keras.random.randint((batch, 2), 0, 2 * pad + 1, seed=self.seed_generator)
        rows = ops.expand_dims(offsets[:, :1], -1) + ops.reshape(ops.arange(height), (1, height, 1))
        rows = ops.broadcast_to(ops.expand_dims(rows, -1), (batch, height, width + 2 * pad, channels))
        cropped = ops.take_along_axis(padded, rows, axis=1)
        columns = ops.expand_dims(offsets[:, 1:], -1) + ops.reshape(ops.arange(width), (1, 1, width))
        columns = ops.broadcast_to(ops.expand_dims(columns, -1), (batch, height, width, channels))
        return ops.take_along_axis(cropped, columns, axis=2)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(padding=self.padding, seed=self.seed)
        return config


@keras.saving.register_keras_serializable(package="keras_preact_training")
class RandomCutout(keras.layers.Layer):
    """Sets one `size` x `size` square of every image to zero, at a random place.

    Cutout (DeVries and Taylor, "Improved Regularization of Convolutional Neural Networks
    with Cutout", 2017, arXiv:1708.04552, Section 3): each image of a batch gets its own
    square, rows `cy - size // 2` to `cy - size // 2 + size - 1` and the same for columns,
    its centre (cy, cx) uniform over the image's pixels, so that near a border only part of
    the square falls inside, which the authors found to matter. Applied after normalisation,
    as theirs, the square holds the mean pixel. At inference the layer returns its input.

    Args:
        size: the square's side in pixels (16 on CIFAR-10 in the paper; 0: no square).
        seed: seed of the layer's random generator.
    """

    def __init__(self, size=16, seed=None, **kwargs):
        super().__init__(**kwargs)
        if not defaults.is_integer(size) or size < 0:
            raise ValueError(f"size must be an integer >= 0. Received: size={size!r}")
        self.size = int(size)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def call(self, images, training=None):
        if not training or self.size == 0:
            return images
        batch = ops.shape(images)[0]
        height, width = images.shape[1:3]
        rows = self.covered(batch, height)
        columns = self.covered(batch, width)
        covered = ops.logical_and(ops.expand_dims(rows, 2), ops.expand_dims(columns, 1))
        return ops.where(ops.expand_dims(covered, -1), ops.zeros((), images.dtype), images)

    def covered(self, batch, length):
        """[batch, length] booleans: the rows (or columns) each image's square covers."""
        start = keras.random.randint((batch, 1), 0, length, seed=self.seed_generator) - self.size // 2
        positions = ops.expand_dims(ops.arange(length), 0)
        return ops.logical_and(ops.greater_equal(positions, start), ops.less(positions, start + self.size))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(size=self.size, seed=self.seed)
        return config
