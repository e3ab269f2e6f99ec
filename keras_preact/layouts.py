"""A network's units in either layout: as separate layers, or as loops (`StackedUnits`).

A model function builds a stage's units 2 to n as one `keras_preact.stacked.StackedUnits`
layer where `scan_units` asks for it; the functions here move weights between the two
layouts, load a weights file saved in either, and rebuild a looped network with separate units. The units of a loop keep the
names they have as separate layers (`stage1_unit2`, ...), which is how weights find
their counterparts.
"""

import os
import re
import warnings

import keras

from keras_preact import stacked, walks


def stacked_name(stage, unit_count):
    """The name of the `StackedUnits` layer that holds units 2 to `unit_count` of `stage`."""
    return f"stage{stage}_units2to{unit_count}"


STACKED_NAME = re.compile(r"stage(\d+)_units(\d+)to(\d+)")


def _unit_names(layer):
    """The names a layer's units have in a network of separate units."""
    match = STACKED_NAME.fullmatch(layer.name) if isinstance(layer, stacked.StackedUnits) else None
    if match is None:
        return [layer.name]
    stage, first, last = map(int, match.groups())
    return [f"stage{stage}_unit{index}" for index in range(first, last + 1)]


def copy_weights(source: keras.Model, target: keras.Model) -> None:
    """Copies every weight of `source` into `target`, the same network in either layout.

    The two may differ in `scan_units`: a `StackedUnits` layer's slices go to or come
    from the separate units of the same names (`stage1_unit2`, ...).

    Raises:
        ValueError: if a layer or unit of `target` has no counterpart in `source`, or
            their weights differ in number or shape.
    """
    weights = {}
    for layer in source.layers:
        for index, name in enumerate(_unit_names(layer)):
            weights[name] = (
                layer.unit_weights(index) if isinstance(layer, stacked.StackedUnits) else layer.get_weights()
            )
    for layer in target.layers:
        if not layer.weights:  # inputs, pooling, ReLU: nothing to copy, whatever the source has
            continue
        names = _unit_names(layer)
        missing = [name for name in names if name not in weights]
        if missing:
            raise ValueError(
                f"copy_weights needs the same network in both models; {source.name} has no layers "
                f"{missing[:3]}{' ...' if len(missing) > 3 else ''}. Received: source={source.name}, "
                f"target={target.name}"
            )
        if isinstance(layer, stacked.StackedUnits):
            for index, name in enumerate(names):
                layer.set_unit_weights(index, weights[name])
        else:
            layer.set_weights(weights[layer.name])


def separate_units(model: keras.Model) -> keras.Model:
    """`model` with each loop of units (`StackedUnits`) as separate units, the same weights.

    The network a model function builds with `scan_units=False`, made from any model
    whose layers form a chain (every keras-preact network): for `keras_preact.analysis`,
    which measures units one by one, or to save a file in the other layout. A model
    without loops is returned as it is.

    Raises:
        ValueError: for a model with loops whose layers do not form a chain.
    """
    if not any(isinstance(layer, stacked.StackedUnits) for layer in model.layers):
        return model
    inputs = keras.Input(shape=model.inputs[0].shape[1:], dtype=model.inputs[0].dtype, name=model.inputs[0].name)
    x = inputs
    for layer in walks.chain_layers(model):
        if isinstance(layer, stacked.StackedUnits):
            unit_config = layer.unit.get_config()
            for name in _unit_names(layer):
                x = type(layer.unit).from_config({**unit_config, "name": name})(x)
        else:
            x = type(layer).from_config(layer.get_config())(x)
    separate = keras.Model(inputs, x, name=model.name)
    copy_weights(model, separate)
    return separate


def load_weights_file(model, path, other_layout=None):
    """`model.load_weights(path)`, its errors naming the file.

    `other_layout`: where given, a function that builds the same network with the other
    `scan_units` layout; a file that does not fit `model` is then tried in that network
    and, if it fits there, its weights are copied into `model` (`copy_weights`).

    Raises:
        ValueError: for a file that cannot be read or fits neither layout.
    """
    try:
        # Keras warns of each loop it cannot fill from a file of separate units before it fails.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.load_weights(path)
    except Exception as error:
        failure = error
    else:
        for warning in caught:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
        return
    if other_layout is not None and os.path.isfile(path):
        other = other_layout()
        try:
            # A file of another network fails here too, after Keras has warned of each layer.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                other.load_weights(path)
        except Exception:
            pass
        else:
            copy_weights(other, model)
            return
    # Keras' message lists every layer that did not load: its first sentence says how many.
    reason = str(failure).strip().splitlines()[0].split(". ")[0][:MESSAGE_CHARACTERS] if str(failure).strip() else ""
    raise ValueError(
        f"Could not load the weights file {os.fspath(path)} into {model.name}: a file saved from another network, "
        f"or a truncated or corrupt one ({type(failure).__name__}: {reason}). Give the weights of this very network."
    ) from failure


# The most of a loading error's own message repeated in ours.
MESSAGE_CHARACTERS = 200
