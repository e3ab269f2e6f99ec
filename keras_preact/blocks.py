"""Convolution and BatchNorm as every unit of the paper uses them."""

import keras
from keras import ops

from keras_preact import defaults


@keras.saving.register_keras_serializable(package="keras_preact")
class SymmetricConv2D(keras.layers.Conv2D):
    """A bias-free `Conv2D` padded like Caffe and Torch: `(k - 1) // 2` on every side.

    For stride 1 this is Keras' `padding="same"`. For stride 2 Keras pads only the
    bottom and right, which shifts the sampling grid by one pixel against the
    paper's code and against a stride-2 shortcut that keeps pixels 0, 2, 4, ...; here
    the padding is explicit and symmetric, so a strided 3x3 convolution is centred on
    the same pixels the shortcut keeps.

    Args:
        filters: number of output channels.
        kernel_size: odd integer size of the square kernel.
        strides: integer stride.
        weight_decay: coupled weight decay on the kernel (see
            `defaults.weight_regularizer`).
        **kwargs: other `keras.layers.Conv2D` arguments (`name`, `dtype`, ...).
    """

    def __init__(self, filters, kernel_size, strides=1, weight_decay=0.0, **kwargs):
        if not isinstance(kernel_size, int) or kernel_size % 2 != 1:
            raise ValueError(
                f"kernel_size must be an odd integer. Received: kernel_size={kernel_size!r}"
            )
        self.weight_decay = defaults.validate_weight_decay(weight_decay)
        self.explicit_padding = (kernel_size - 1) // 2 if strides > 1 else 0
        kwargs.pop("padding", None)
        kwargs.pop("use_bias", None)
        kwargs.setdefault("kernel_initializer", defaults.conv_initializer())
        super().__init__(
            filters,
            kernel_size,
            strides=strides,
            padding="valid" if self.explicit_padding else "same",
            use_bias=False,
            kernel_regularizer=defaults.weight_regularizer(self.weight_decay),
            **kwargs,
        )

    def call(self, inputs):
        if self.explicit_padding:
            pad = self.explicit_padding
            inputs = ops.pad(inputs, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
        return super().call(inputs)

    def compute_output_shape(self, input_shape):
        batch, height, width, _ = input_shape
        return (batch, strided_size(height, self.strides[0]), strided_size(width, self.strides[1]), self.filters)

    def get_config(self):
        config = super().get_config()
        for rebuilt in ("padding", "use_bias", "kernel_regularizer", "bias_initializer",
                        "bias_regularizer", "bias_constraint"):
            config.pop(rebuilt, None)
        config["kernel_size"] = self.kernel_size[0]
        config["strides"] = self.strides[0]
        config["weight_decay"] = self.weight_decay
        return config


def strided_size(size, stride):
    """Spatial size after a symmetric-padded (or 1x1) convolution: ceil(size / stride)."""
    return None if size is None else -(-size // stride)


@keras.saving.register_keras_serializable(package="keras_preact")
class BatchNorm(keras.layers.BatchNormalization):
    """Keras' BatchNormalization that can hand its batch statistics out instead of
    updating its moving averages with them.

    While a `StatisticsCollector` collects from it, a call normalizes with the batch's
    mean and variance (training mode: the collector is only used while training),
    appends them to the collector and leaves the moving averages alone;
    `update_moving_statistics` applies them afterwards exactly as Keras' own training
    call does. A rematerialized residual branch needs this: its forward pass runs again
    while the gradients are computed, and must not update the averages twice.
    """

    collector = None

    def call(self, inputs, training=None, mask=None):
        if self.collector is None or mask is not None or self.renorm or not self.trainable:
            return super().call(inputs, training=training, mask=mask)
        inputs = ops.cast(inputs, keras.backend.result_type(inputs.dtype, "float32"))
        axes = [axis for axis in range(len(inputs.shape)) if axis != self.axis % len(inputs.shape)]
        mean, variance = ops.moments(inputs, axes=axes, synchronized=self.synchronized)
        self.collector.add(self, mean, variance)
        outputs = ops.batch_normalization(
            inputs, mean, variance, axis=self.axis, offset=ops.cast(self.beta, inputs.dtype),
            scale=ops.cast(self.gamma, inputs.dtype), epsilon=self.epsilon,
        )
        return ops.cast(outputs, self.compute_dtype)

    def update_moving_statistics(self, mean, variance):
        """moving <- moving * momentum + batch * (1 - momentum), as Keras' training call."""
        for moving, batch in ((self.moving_mean, mean), (self.moving_variance, variance)):
            moving.assign(ops.cast(moving, batch.dtype) * self.momentum + batch * (1.0 - self.momentum))


class StatisticsCollector:
    """Collects the batch statistics of `BatchNorm` layers called inside `with collector:`."""

    def __init__(self, layers):
        self.layers = list(layers)
        self.called, self.statistics = [], []

    def add(self, layer, mean, variance):
        self.called.append(layer)
        self.statistics.append((mean, variance))

    def __enter__(self):
        for layer in self.layers:
            layer.collector = self
        return self

    def __exit__(self, *exception):
        for layer in self.layers:
            layer.collector = None


def batch_norm(weight_decay, name, dtype=None):
    """BatchNorm with the official code's momentum and epsilon, decay on gamma and beta.

    The official code applies weight decay to all parameters, BatchNorm's included.
    """
    regularizer = defaults.weight_regularizer(weight_decay)
    return BatchNorm(
        momentum=defaults.BATCH_NORM_MOMENTUM,
        epsilon=defaults.BATCH_NORM_EPSILON,
        gamma_regularizer=regularizer,
        beta_regularizer=regularizer,
        name=name,
        dtype=dtype,
    )
