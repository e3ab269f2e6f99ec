"""Shortcut paths h(x_l) of a residual unit.

Where a unit keeps its shape the shortcut is the identity. Where it changes shape
(more channels, stride 2), the original ResNet paper ([1], He et al., CVPR 2016) offers
option A, a parameter-free zero-padded identity (used by the paper's basic CIFAR nets,
ResNet-20 ... ResNet-1202), and option B, a 1x1 projection (used by ResNet-164/1001 and
the ImageNet nets). A projection on every unit is the paper's Fig. 2(e).
"""

import keras
from keras import ops

from keras_preact import base_layers, defaults


class Shortcut(keras.layers.Layer):
    """Base class: a shortcut that maps `(H, W, C_in)` to `(H/s, W/s, output_channels)`."""

    def __init__(self, output_channels: int, strides: int = 1, weight_decay: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        if not defaults.is_integer(output_channels) or output_channels < 1:
            raise ValueError(
                f"output_channels must be a positive integer. Received: output_channels={output_channels!r}"
            )
        if strides not in (1, 2):
            raise ValueError(f"strides must be 1 or 2. Received: strides={strides!r}")
        self.output_channels = int(output_channels)
        self.strides = strides
        self.weight_decay = defaults.validate_weight_decay(weight_decay)

    def folding_pairs(self):
        """The shortcut's (convolution, BatchNorm) pairs (see `ResidualUnit.folding_pairs`)."""
        return []

    def compute_output_shape(self, input_shape):
        batch, height, width, _ = input_shape
        return (
            batch,
            base_layers.strided_size(height, self.strides),
            base_layers.strided_size(width, self.strides),
            self.output_channels,
        )

    def get_config(self):
        config = super().get_config()
        config.update(output_channels=self.output_channels, strides=self.strides, weight_decay=self.weight_decay)
        return config


@keras.saving.register_keras_serializable(package="keras_preact")
class IdentityShortcut(Shortcut):
    """h(x) = x. Needs the unit to keep its shape."""

    def build(self, input_shape):
        if input_shape[-1] != self.output_channels or self.strides != 1:
            raise ValueError(
                "An identity shortcut cannot change the shape of its input; use "
                "shortcut='zero_pad' or 'projection' where a unit changes width or "
                f"resolution. Received: {input_shape[-1]} input channels, "
                f"output_channels={self.output_channels}, strides={self.strides}"
            )

    def call(self, inputs):
        return inputs


@keras.saving.register_keras_serializable(package="keras_preact")
class ZeroPaddingShortcut(Shortcut):
    """Option A of [1]: keep every `strides`-th pixel and append zero channels. No weights."""

    def build(self, input_shape):
        if input_shape[-1] > self.output_channels:
            raise ValueError(
                "A zero-padding shortcut can only add channels. Received: "
                f"{input_shape[-1]} input channels, output_channels={self.output_channels}"
            )

    def call(self, inputs):
        subsampled = inputs[:, :: self.strides, :: self.strides, :]
        new_channels = self.output_channels - inputs.shape[-1]
        return ops.pad(subsampled, [[0, 0], [0, 0], [0, 0], [0, new_channels]])


@keras.saving.register_keras_serializable(package="keras_preact")
class ProjectionShortcut(Shortcut):
    """Option B of [1]: a strided 1x1 convolution, followed by BatchNorm if `normalize`.

    Original (post-activation) units normalize the projection as they normalize every
    convolution output; the official pre-activation code does not (the projection
    reads an already normalized and activated tensor).
    """

    def __init__(
        self, output_channels: int, strides: int = 1, normalize: bool = True, weight_decay: float = 0.0, **kwargs
    ):
        super().__init__(output_channels, strides, weight_decay, **kwargs)
        self.normalize = bool(normalize)
        self.conv = base_layers.SymmetricConv2D(
            output_channels, 1, strides, self.weight_decay, name="conv", dtype=self.dtype_policy
        )
        self.norm = (
            base_layers.batch_norm(self.weight_decay, name="bn", dtype=self.dtype_policy) if self.normalize else None
        )

    def build(self, input_shape):
        self.conv.build(input_shape)
        if self.norm is not None:
            self.norm.build(self.conv.compute_output_shape(input_shape))

    def call(self, inputs):
        projected = self.conv(inputs)
        return self.norm(projected) if self.norm is not None else projected

    def folding_pairs(self):
        return [(self.conv, self.norm)] if self.norm is not None else []

    def get_config(self):
        config = super().get_config()
        config["normalize"] = self.normalize
        return config


SHORTCUTS = {
    "identity": IdentityShortcut,
    "zero_pad": ZeroPaddingShortcut,
    "projection": ProjectionShortcut,
}


def make_shortcut(kind, output_channels, strides, normalize_projection, weight_decay, dtype=None):
    """The shortcut layer named `kind` (a key of `SHORTCUTS`), named "shortcut"."""
    if kind not in SHORTCUTS:
        raise ValueError(f"shortcut must be one of {sorted(SHORTCUTS)}. Received: shortcut={kind!r}")
    options = {"normalize": normalize_projection} if kind == "projection" else {}
    return SHORTCUTS[kind](output_channels, strides, weight_decay=weight_decay, name="shortcut", dtype=dtype, **options)
