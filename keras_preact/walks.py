"""Walks over a network's layers: the chain of its top-level layers, every nested layer (the
templates of `StackedUnits` loops included), its BatchNorms and their moving statistics.

Layer files define layers; the walks over whole networks live here, above them, so that no
layer module imports another to reach a network's layers.
"""

import keras

from keras_preact import base_layers, stacked


def all_layers(model):
    """Every layer inside `model`, with the layers of each `StackedUnits`' unit, which
    Keras' own layer walk does not reach (they hold no weights of the model)."""
    layers = []
    for layer in model._flatten_layers(include_self=False):
        layers.append(layer)
        if isinstance(layer, stacked.StackedUnits):
            layers.extend(layer.unit._flatten_layers())
    return layers


def moving_statistics(model):
    """The moving means and variances of every BatchNorm of `model`: for a BatchNorm in a
    `StackedUnits` layer, the stacked variables that hold them for all its units."""
    statistics = []
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, keras.layers.BatchNormalization):
            statistics += [layer.moving_mean, layer.moving_variance]
        elif isinstance(layer, stacked.StackedUnits):
            for norm in layer.unit._flatten_layers():
                if isinstance(norm, keras.layers.BatchNormalization):
                    statistics += [layer.stacked(norm.moving_mean), layer.stacked(norm.moving_variance)]
    return statistics


def batch_norms(model):
    """Every BatchNormalization layer of `model`, those of its units and loops included."""
    return [layer for layer in all_layers(model) if isinstance(layer, keras.layers.BatchNormalization)]


def set_fused(model, fused):
    """Sets `keras_preact.base_layers.BatchNorm.fused` on every BatchNorm of `model` (those of
    loops too); call it before the first call that is traced. Returns how many were set.

    Units build their BatchNorms themselves, so a unit rebuilt from a saved model has the
    default (fused) again: the same computation to float rounding.
    """
    if not isinstance(fused, bool):
        raise ValueError(f"fused must be True or False. Received: fused={fused!r}")
    norms = [layer for layer in batch_norms(model) if isinstance(layer, base_layers.BatchNorm)]
    for norm in norms:
        norm.fused = fused
    return len(norms)


def is_chain(model):
    """Whether the layers of `model` form a chain (`chain_layers`)."""
    try:
        chain_layers(model)
    except ValueError:
        return False
    return True


def chain_layers(model):
    """The layers of `model` after its input, checked to form a chain (each reads the
    previous one's output).

    Raises:
        ValueError: naming the first layer that reads another tensor.
    """
    layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    previous = model.inputs[0]
    for layer in layers:
        if layer.input is not previous:
            raise ValueError(
                "This needs a model whose layers form a chain, each reading the previous one's output "
                f"(every keras-preact network does). Received: layer {layer.name!r} of model "
                f"{model.name!r} reads another tensor"
            )
        previous = layer.output
    return layers
