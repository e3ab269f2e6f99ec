"""How a unit combines its shortcut h(x) with its residual branch F(x): Fig. 2 of the paper.

Each merge is a layer called as `merge(shortcut, residual)`. Table 1 of the paper
trains ResNet-110 with each of them (CIFAR-10 test error, median of 5 runs):
`Addition` 6.61 %, `ConstantScaling(0.5, 0.5)` 12.35 %, `ExclusiveGating(-6)` 8.70 %,
`ShortcutOnlyGating(-6)` 6.91 %, `ShortcutDropout(0.5)` fails (above 20 %), and
`NoShortcut` (a plain network, constant scaling 0) fails.

The gates read the shortcut h(x). Where h is the identity (every unit that keeps its
shape) this is the paper's g(x); in the few units that change shape it is the gate of
the subsampled, padded or projected input, which has the residual's shape.
"""

import keras
from keras import ops

from keras_preact import defaults


class Merge(keras.layers.Layer):
    """Base of the merges: `merge(shortcut, residual)` returns the unit's y = h(x) (+) F(x).

    A merge's own constructor arguments are what `arguments()` returns: its config adds them
    to the layer's, and a unit builds its copy from them (see `copy_for_unit`).
    """

    def arguments(self):
        """The merge's own constructor arguments, without the layer's (name, dtype)."""
        return {}

    def get_config(self):
        return {**super().get_config(), **self.arguments()}


@keras.saving.register_keras_serializable(package="keras_preact")
class Addition(Merge):
    """Fig. 2(a), the paper's choice: y = h(x) + F(x)."""

    def call(self, shortcut, residual):
        return ops.add(shortcut, residual)


@keras.saving.register_keras_serializable(package="keras_preact")
class NoShortcut(Merge):
    """A plain unit: y = F(x). The shortcut is dropped (constant scaling with lambda = 0)."""

    def call(self, shortcut, residual):
        return residual


@keras.saving.register_keras_serializable(package="keras_preact")
class ConstantScaling(Merge):
    """Fig. 2(b): y = shortcut_scale * h(x) + residual_scale * F(x).

    Args:
        shortcut_scale: lambda, the paper's 0.5 (or 0: a plain network).
        residual_scale: 1 (the paper's "0.5 / 1" row) or 1 - lambda ("0.5 / 0.5").
    """

    def __init__(self, shortcut_scale: float = 0.5, residual_scale: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        for argument, value in (("shortcut_scale", shortcut_scale), ("residual_scale", residual_scale)):
            if not defaults.is_finite_number(value):
                raise ValueError(f"{argument} must be a finite number. Received: {argument}={value!r}")
        self.shortcut_scale = float(shortcut_scale)
        self.residual_scale = float(residual_scale)

    def call(self, shortcut, residual):
        return self.shortcut_scale * shortcut + self.residual_scale * residual

    def arguments(self):
        return {"shortcut_scale": self.shortcut_scale, "residual_scale": self.residual_scale}


class Gate(Merge):
    """Base of the gated merges: g(x) = sigmoid(W_g x + b_g), W_g a 1x1 convolution.

    Args:
        gate_bias: the initial value of b_g. The paper searches 0 to -10 and finds -6
            best for exclusive gating (Table 1); a very negative bias starts the unit
            close to the identity.
        weight_decay: coupled weight decay on W_g and b_g. A unit sets it to its own
            decay (see `copy_for_unit`).
    """

    def __init__(self, gate_bias: float = 0.0, weight_decay: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        if not defaults.is_finite_number(gate_bias):
            raise ValueError(f"gate_bias must be a finite number. Received: gate_bias={gate_bias!r}")
        self.gate_bias = float(gate_bias)
        self.weight_decay = defaults.validate_weight_decay(weight_decay)

    def build(self, shortcut_shape, residual_shape):
        regularizer = defaults.weight_regularizer(self.weight_decay)
        # A 1x1 convolution is a matrix product over the channel axis.
        self.kernel_initializer = defaults.conv_initializer()
        self.bias_initializer = keras.initializers.Constant(self.gate_bias)
        self.kernel = self.add_weight(
            shape=(shortcut_shape[-1], residual_shape[-1]),
            initializer=self.kernel_initializer,
            regularizer=regularizer,
            name="kernel",
        )
        self.bias = self.add_weight(
            shape=(residual_shape[-1],),
            initializer=self.bias_initializer,
            regularizer=regularizer,
            name="bias",
        )

    def gate(self, shortcut):
        return ops.sigmoid(ops.matmul(shortcut, self.kernel) + self.bias)

    def arguments(self):
        return {"gate_bias": self.gate_bias, "weight_decay": self.weight_decay}


@keras.saving.register_keras_serializable(package="keras_preact")
class ExclusiveGating(Gate):
    """Fig. 2(c), as in Highway networks: y = g(x) F(x) + (1 - g(x)) h(x)."""

    def call(self, shortcut, residual):
        gate = self.gate(shortcut)
        return gate * residual + (1.0 - gate) * shortcut


@keras.saving.register_keras_serializable(package="keras_preact")
class ShortcutOnlyGating(Gate):
    """Fig. 2(d): y = F(x) + (1 - g(x)) h(x)."""

    def call(self, shortcut, residual):
        return residual + (1.0 - self.gate(shortcut)) * shortcut


@keras.saving.register_keras_serializable(package="keras_preact")
class ShortcutDropout(Merge):
    """Fig. 2(f): y = F(x) + dropout(h(x)), dropout `rate` 0.5 in the paper.

    Dropout scales the kept values by 1 / (1 - rate) while training, as Caffe's does.
    """

    def __init__(self, rate: float = 0.5, seed: int | None = None, **kwargs):
        super().__init__(**kwargs)
        if not defaults.is_finite_number(rate) or not 0 <= rate < 1:
            raise ValueError(f"rate must be a number in [0, 1). Received: rate={rate!r}")
        self.rate = float(rate)
        self.seed = seed
        self.dropout = keras.layers.Dropout(self.rate, seed=seed, name="dropout", dtype=self.dtype_policy)

    def call(self, shortcut, residual, training=None):
        return residual + self.dropout(shortcut, training=training)

    def arguments(self):
        return {"rate": self.rate, "seed": self.seed}


def copy_for_unit(merge, weight_decay, dtype_policy):
    """A copy of `merge` named "merge", with a unit's dtype policy and weight decay.

    Built from `arguments()`, not from the config: Keras' serialization imports TensorFlow
    wherever it is installed, and building a network on JAX or PyTorch must not. A merge of
    the user's own that defines `get_config` instead is copied through its config.
    """
    if type(merge).get_config is Merge.get_config:
        arguments = merge.arguments()
        if "weight_decay" in arguments:
            arguments["weight_decay"] = weight_decay
        return type(merge)(**arguments, name="merge", dtype=dtype_policy)
    config = merge.get_config()
    config.update(name="merge", dtype=dtype_policy)
    if "weight_decay" in config:
        config["weight_decay"] = weight_decay
    return type(merge).from_config(config)
