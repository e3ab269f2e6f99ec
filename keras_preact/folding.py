"""BatchNorm folded into the convolution before it, for inference and export.

In inference a BatchNorm is an affine map per channel, y = gamma (x - mean) /
sqrt(variance + epsilon) + beta; where it reads a bias-free convolution's output and
nothing else reads that output, the two are one convolution with its kernel scaled per
output channel and a bias: conv(x; W) -> BN = conv(x; W * scale) + (beta - mean * scale),
scale = gamma / sqrt(variance + epsilon). That is every convolution of an original unit
(Fig. 4(a)) and of its projection shortcut, the stem's, and in a pre-activation unit
(Fig. 4(e)) every convolution but the last, whose output goes to the addition.
"""

import itertools

import keras
from keras import ops

from keras_preact import base_layers, stacked, units, walks


def fold_batch_norms(model: keras.Model) -> keras.Model:
    """A copy of `model` for inference with its BatchNorms folded into their convolutions.

    The copy has the layers, names and layout (separate units or loops) of `model` and
    computes what it computes in inference, to float32 rounding, without the folded
    BatchNorms' normalisation: each folded convolution's kernel is scaled per output
    channel, and its BatchNorm only adds the folded bias (held in its `beta`). BatchNorms
    that read anything but a convolution's output alone (a pre-activation, BatchNorm after
    the addition, the final BatchNorm) stay as they are. `model` is not changed.

    The copy is for inference and export: it is not trainable, and its folding is not
    part of its config (a saved copy loads unfolded, with the folded weights; save
    `model` instead).

    Args:
        model: a keras-preact network (its layers a chain, as `separate_units` needs).

    Returns:
        The folded copy, with `folded_batch_norms`: how many BatchNorms it folded.

    Raises:
        ValueError: for a model whose layers do not form a chain.

    Example:

    >>> model = keras_preact.ResNet20(weights="cifar10")
    >>> folded = keras_preact.fold_batch_norms(model)
    >>> folded.folded_batch_norms  # the stem's and one per unit
    10
    """
    walks.chain_layers(model)  # raises for a model it cannot walk
    folded = keras.models.clone_model(model)
    folded.set_weights(model.get_weights())
    pairs = folding_pairs(folded)
    for conv, norm, variable_of in pairs:
        kernel, bias = folded_weights(
            variable_of(conv.kernel),
            variable_of(norm.gamma),
            variable_of(norm.beta),
            variable_of(norm.moving_mean),
            variable_of(norm.moving_variance),
            norm.epsilon,
        )
        variable_of(conv.kernel).assign(kernel)
        variable_of(norm.beta).assign(bias)
        norm.folded = True
    folded.trainable = False
    folded.folded_batch_norms = len(pairs)
    return folded


def folded_weights(kernel, gamma, beta, mean, variance, epsilon):
    """(kernel * scale, beta - mean * scale), scale = gamma / sqrt(variance + epsilon).

    `kernel` is (..., height, width, inputs, outputs) and the BatchNorm's weights
    (..., outputs), with the same leading axes (a `StackedUnits`' stack of units).
    """
    kernel, gamma, beta, mean, variance = map(ops.convert_to_tensor, (kernel, gamma, beta, mean, variance))
    scale = gamma / ops.sqrt(variance + epsilon)
    kernel_scale = ops.expand_dims(ops.expand_dims(ops.expand_dims(scale, -2), -2), -2)  # over height, width, inputs
    return kernel * kernel_scale, beta - mean * scale


def folding_pairs(model):
    """(convolution, BatchNorm, variable_of) for each foldable pair of `model`, where
    `variable_of` maps a variable of the two layers to the one holding its values (in a
    `StackedUnits`, the stacked variable of every unit)."""
    own = lambda variable: variable  # noqa: E731
    layers = walks.chain_layers(model)
    pairs = [
        (conv, norm, own)
        for conv, norm in itertools.pairwise(layers)
        if isinstance(conv, base_layers.SymmetricConv2D) and isinstance(norm, base_layers.BatchNorm)
    ]
    for layer in layers:
        if isinstance(layer, units.ResidualUnit):
            pairs += [(conv, norm, own) for conv, norm in layer.folding_pairs()]
        elif isinstance(layer, stacked.StackedUnits):
            pairs += [(conv, norm, layer.stacked) for conv, norm in layer.unit.folding_pairs()]
    return pairs
