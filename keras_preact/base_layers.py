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
            raise ValueError(f"kernel_size must be an odd integer. Received: kernel_size={kernel_size!r}")
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
        for rebuilt in (
            "padding",
            "use_bias",
            "kernel_regularizer",
            "bias_initializer",
            "bias_regularizer",
            "bias_constraint",
        ):
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
    """Keras' BatchNormalization as the official Torch code computes it, fused on TensorFlow.

    Three differences from Keras' layer, none in the arguments or the weights:

    - **The moving variance is updated with the unbiased batch variance**, n / (n - 1)
      times the biased one that normalizes the batch (n: the values per channel), as
      Torch's BatchNorm (and so the official code) and TensorFlow's fused kernel do;
      Keras uses the biased one. The two differ by 1/n, below 0.1 % from 8 images of 8x8.
    - **On the TensorFlow backend** a channels-last 4-D input runs TensorFlow's fused
      kernel (`FusedBatchNormV3`, one op forward and one backward instead of about ten),
      in training and inference; in training the kernel also updates the moving
      averages (its `exponential_avg_factor`), which the `keras.ops` path computes from
      five operations per statistic. It computes what the `keras.ops` path computes
      (tested to float rounding). Other backends, other layouts and synchronized statistics
      (which the fused kernel cannot reduce across replicas) and float64 take the
      `keras.ops` path.
      `fused=False` (or `keras_preact.walks.set_fused(model, False)` for every BatchNorm of a network) turns
      the fused path off: a setting to measure and test one path against the other (the
      training config's `fused_batch_norm`), saved in the layer's config.
    - **Batch statistics can be handed out** instead of updating the moving averages:
      while a `StatisticsCollector` collects from it, a training call appends its
      batch mean and unbiased variance to the collector and leaves the moving averages
      alone; `update_moving_statistics` applies them afterwards. A rematerialized
      residual branch needs this: its forward pass runs again while the gradients are
      computed, and must not update the averages twice.

    As in Keras, a layer that is not trainable normalizes with its moving statistics,
    and inputs of lower precision (mixed precision) are normalized with float32 arithmetic.

    A BatchNorm folded into the convolution before it (`keras_preact.fold_batch_norms`)
    only adds its `beta`, which then holds the folded bias, in training and inference.
    """

    collector = None
    folded = False

    def __init__(self, *args, fused=True, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(fused, bool):
            raise ValueError(f"fused must be True or False. Received: fused={fused!r}")
        self.fused = fused

    def get_config(self):
        return {**super().get_config(), "fused": self.fused}

    def call(self, inputs, training=None, mask=None):
        if self.folded:
            return ops.cast(ops.add(inputs, ops.cast(self.beta, inputs.dtype)), self.compute_dtype)
        if mask is not None or self.renorm:
            return super().call(inputs, training=training, mask=mask)
        fused = self.runs_fused_kernel(inputs)
        # Statistics and parameters in float32, in float64 for float64 inputs (on every backend:
        # `keras.backend.result_type` would give float32 for them outside TensorFlow); the fused
        # kernel reads and writes bfloat16 activations as they are, other inputs are normalized
        # as float32.
        input_dtype = keras.backend.standardize_dtype(inputs.dtype)
        dtype = "float64" if input_dtype == "float64" else "float32"
        if not (fused and input_dtype == "bfloat16"):
            inputs = ops.cast(inputs, dtype)
        gamma = ops.cast(self.gamma, dtype) if self.scale else ops.ones(inputs.shape[-1:], dtype)
        beta = ops.cast(self.beta, dtype) if self.center else ops.zeros(inputs.shape[-1:], dtype)
        # A collector collects only while training; the backward pass's recomputation runs
        # outside the network's call, which passes `training` on.
        if (training or self.collector is not None) and self.trainable:
            if fused and self.collector is None:
                # The kernel updates the moving averages itself (five operations fewer per statistic).
                outputs, moving_mean, moving_variance = _tensorflow_fused_batch_norm(
                    inputs, gamma, beta, self.epsilon, self.moving_mean, self.moving_variance, 1.0 - self.momentum
                )
                self.moving_mean.assign(moving_mean)
                self.moving_variance.assign(moving_variance)
                return ops.cast(outputs, self.compute_dtype)
            if fused:
                outputs, mean, variance = _tensorflow_fused_batch_norm(inputs, gamma, beta, self.epsilon)
            else:
                rank = len(inputs.shape)
                axes = [axis for axis in range(rank) if axis != self.axis % rank]  # every axis but the channels'
                mean, variance = ops.moments(inputs, axes=axes, synchronized=self.synchronized)
                outputs = ops.batch_normalization(
                    inputs, mean, variance, axis=self.axis, offset=beta, scale=gamma, epsilon=self.epsilon
                )
                # Bessel's correction, as Torch and the fused kernel: n / (n - 1), 1 for n = 1.
                count = ops.cast(ops.prod(ops.take(ops.shape(inputs), axes)), inputs.dtype)
                if self.synchronized:
                    count = count * _replicas_in_sync()
                variance = variance * count / ops.maximum(count - 1.0, 1.0)
            if self.collector is not None:
                self.collector.add(self, mean, variance)
            else:
                self.update_moving_statistics(mean, variance)
        else:
            mean, variance = (ops.cast(self.moving_mean, dtype), ops.cast(self.moving_variance, dtype))
            if fused:
                outputs = _tensorflow_fused_batch_norm(inputs, gamma, beta, self.epsilon, mean, variance)
            else:
                outputs = ops.batch_normalization(
                    inputs, mean, variance, axis=self.axis, offset=beta, scale=gamma, epsilon=self.epsilon
                )
        return ops.cast(outputs, self.compute_dtype)

    def runs_fused_kernel(self, inputs):
        """Whether a call on `inputs` runs TensorFlow's fused kernel, which computes in float32:
        every input but float64 (float16 ones cast to float32 around it; bfloat16 ones, as mixed
        precision trains, read and written as they are, twice as fast forward and backward as
        cast, docs/benchmarks.md)."""
        return (
            self.fused
            and keras.backend.backend() == "tensorflow"
            and len(inputs.shape) == 4
            and self.axis % 4 == 3
            and not self.synchronized
            and keras.backend.standardize_dtype(inputs.dtype) != "float64"
        )

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


# The TensorFlow-specific part of BatchNorm, in one place.


def _tensorflow_fused_batch_norm(inputs, gamma, beta, epsilon, mean=None, variance=None, average_factor=None):
    """TensorFlow's fused kernel on NHWC float32 or bfloat16 `inputs`, float32 `gamma` and `beta`.

    Training without `mean` and `variance`: returns (outputs, batch mean, batch variance
    with Bessel's correction); the outputs are normalized with the biased variance.
    Training with the moving `mean` and `variance` and their `average_factor` (1 -
    momentum): returns (outputs, the new moving mean, the new moving variance), moving <-
    moving (1 - average_factor) + batch average_factor, as `BatchNorm.update_moving_statistics`.
    Inference (`mean` and `variance`, no factor): returns the outputs normalized with them.
    """
    import tensorflow as tf

    if mean is None:
        return tf.compat.v1.nn.fused_batch_norm(
            inputs, gamma, beta, epsilon=epsilon, data_format="NHWC", is_training=True
        )
    mean, variance = ops.cast(mean, "float32"), ops.cast(variance, "float32")
    if average_factor is not None:
        return tf.compat.v1.nn.fused_batch_norm(
            inputs,
            gamma,
            beta,
            mean=mean,
            variance=variance,
            epsilon=epsilon,
            data_format="NHWC",
            is_training=True,
            exponential_avg_factor=average_factor,
        )
    outputs, _, _ = tf.compat.v1.nn.fused_batch_norm(
        inputs, gamma, beta, mean=mean, variance=variance, epsilon=epsilon, data_format="NHWC", is_training=False
    )
    return outputs


def _replicas_in_sync():
    """The replicas whose batches synchronized statistics pool: tf.distribute's replica
    count on TensorFlow, 1 elsewhere (Keras synchronizes only under tf.distribute)."""
    if keras.backend.backend() != "tensorflow":
        return 1.0
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    return float(context.num_replicas_in_sync) if context is not None else 1.0
