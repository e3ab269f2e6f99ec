"""A stage's identical residual units as one loop over stacked weights.

After its first unit, every unit of a stage is the same function of different weights:
same width, stride 1, the same shortcut. `StackedUnits` keeps the weights of those
units stacked along a leading axis and runs them with `keras.ops.scan`, so that a
network traces, compiles, exports and loads one unit per stage instead of up to 110
(ResNet-1001). The units compute what the same units as separate layers do (to float
rounding); `keras_preact.layouts` converts a network between the two layouts.
"""

# Annotations stay text: the module imported by Keras' own import (the layers' registration)
# must not evaluate another module's classes while that module is half-imported.
from __future__ import annotations

import keras
from keras import ops

from keras_preact import defaults
from keras_preact import units as units_module


@keras.saving.register_keras_serializable(package="keras_preact")
class StackedUnits(keras.layers.Layer):
    """`count` copies of one residual unit, each with its own weights, run in sequence.

    The layer owns one variable per variable of the unit, with a leading axis of size
    `count`: `conv1_kernel` of shape `(count, 1, 1, 64, 16)`, `bn1_moving_mean` of shape
    `(count, 64)`, ... Each unit's slice is initialised by the unit's own initializer,
    and carries the unit's regularizer (summed over units, as for separate layers). The
    unit itself serves as the template whose `call()` runs on each slice (inside a
    `keras.StatelessScope` that maps its variables to the slice); its own variables are
    never read, trained or saved.

    While training, the units' BatchNorm statistics are carried out of the loop and
    assigned once after it. With `rematerialize`, the loop keeps only each unit's input
    for the backward pass and computes the unit again there (`keras.remat` on the loop
    body); since a unit here returns its new statistics instead of assigning them, the
    recomputation cannot update them twice.

    Args:
        unit: an unbuilt `keras_preact.units.ResidualUnit` whose output has the shape of
            its input (stride 1, as many output channels as input channels), without
            `rematerialize` of its own. Its name is the name of the first unit.
        count: the number of units, at least 1.
        rematerialize: recompute each unit in the backward pass instead of keeping its
            activations.
        **kwargs: `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Example:

    >>> unit = keras_preact.units.PreActivationUnit(16, form="bottleneck", name="stage1_unit2")
    >>> stack = StackedUnits(unit, count=110, name="stage1_units2to111")
    >>> stack(keras.ops.ones((2, 32, 32, 64))).shape
    (2, 32, 32, 64)
    """

    def __init__(self, unit: units_module.ResidualUnit, count: int, rematerialize: bool = False, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(unit, units_module.ResidualUnit) or unit.built:
            raise ValueError(f"unit must be an unbuilt residual unit from keras_preact.units. Received: unit={unit!r}")
        if unit.strides != 1 or unit.rematerialize:
            raise ValueError(
                "unit must keep its input's shape (strides=1) and leave rematerialize to "
                f"StackedUnits. Received: strides={unit.strides}, rematerialize={unit.rematerialize}"
            )
        if not defaults.is_integer(count) or count < 1:
            raise ValueError(f"count must be a positive integer. Received: count={count!r}")
        if not isinstance(rematerialize, bool):
            raise ValueError(f"rematerialize must be True or False. Received: rematerialize={rematerialize!r}")
        # Not an attribute Keras tracks: the template's variables are not the layer's.
        object.__setattr__(self, "unit", unit)
        self.count = int(count)
        self.rematerialize = rematerialize

    def build(self, input_shape):
        self.unit.build(input_shape)
        output_shape = tuple(self.unit.compute_output_shape(input_shape))
        if output_shape != tuple(input_shape):
            raise ValueError(
                f"StackedUnits needs a unit that keeps its input's shape; {self.unit.name} maps "
                f"{tuple(input_shape)} to {output_shape}. Received: input_shape={tuple(input_shape)}"
            )
        layers = {self._relative_path(layer.path): layer for layer in self.unit._flatten_layers() if layer.path}
        self.stacked_trainable = [self._stack(variable, layers) for variable in self.unit.trainable_variables]
        self.stacked_non_trainable = [self._stack(variable, layers) for variable in self.unit.non_trainable_variables]

    def _relative_path(self, path):
        """'.../stage1_unit2/bn1/gamma' -> 'bn1/gamma': a path inside the unit."""
        return path.split(f"{self.unit.name}/", 1)[-1]

    def _stack(self, variable, layers):
        """A variable of shape (count, *variable.shape), initialised unit by unit."""
        owner_path, _, variable_name = self._relative_path(variable.path).rpartition("/")
        initializer = getattr(layers.get(owner_path), f"{variable_name}_initializer", None)
        if initializer is None or variable.constraint is not None:
            raise ValueError(
                f"StackedUnits stacks variables that have a `<name>_initializer` on the layer that owns "
                f"them and no constraint; {variable.path} has not (random state such as ShortcutDropout's "
                "cannot be stacked: build such networks with scan_units=False). Received: "
                f"initializer={initializer!r}, constraint={variable.constraint!r}"
            )
        initializer = keras.initializers.get(initializer)

        def initialize(shape, dtype=None):
            # A fresh initializer per unit: an unseeded Keras initializer draws the same
            # values every time it is called.
            fresh = [type(initializer).from_config(initializer.get_config()) for _ in range(shape[0])]
            return ops.stack([unit_initializer(shape[1:], dtype=dtype) for unit_initializer in fresh])

        return self.add_weight(
            shape=(self.count, *variable.shape),
            initializer=initialize,
            dtype=variable.dtype,
            trainable=variable.trainable,
            autocast=False,
            regularizer=variable.regularizer,
            aggregation=variable.aggregation,
            name=self._relative_path(variable.path).replace("/", "_"),
        )

    def call(self, inputs, training=None):
        # A frozen stack runs its units in inference mode, as a frozen BatchNorm does.
        training = bool(training) and self.trainable

        def unit(x, *values):
            """One unit on its own slice of the weights: (output, its new state).

            Like `Layer.stateless_call`, but through `__call__`, so that the unit's
            layers see `training` also when `keras.remat` runs this again in the
            backward pass, outside the network's call.
            """
            with keras.StatelessScope(state_mapping=list(zip(self._unit_variables(), values))) as scope:
                outputs = self.unit(x, training=training)
            return outputs, [scope.get_current_value(variable) for variable in self.unit.non_trainable_variables]

        if self.rematerialize and training:
            unit = keras.remat(unit)

        def step(carry, slices):
            x, state = carry
            index, trainable = slices
            x, updated = unit(x, *trainable, *[ops.take(stacked, index, axis=0) for stacked in state])
            if training:
                # Only while training does a unit change its state (BatchNorm's moving
                # averages); the loop carries the new values out, to be assigned once.
                # The start indices all of the index's integer type (JAX with 64-bit types on
                # would make Python's zeros int64).
                state = [
                    ops.stop_gradient(
                        ops.slice_update(stacked, [index] + [ops.zeros_like(index)] * len(new.shape), new[None])
                    )
                    for stacked, new in zip(state, updated)
                ]
            return (x, state), None

        state = [variable.value for variable in self.stacked_non_trainable]
        slices = (ops.arange(self.count, dtype="int32"), [variable.value for variable in self.stacked_trainable])
        (outputs, state), _ = ops.scan(step, (inputs, state), slices)
        if training:
            for variable, value in zip(self.stacked_non_trainable, state):
                variable.assign(value)
        return outputs

    def unit_weights(self, index):
        """The weights of unit `index` (0-based), in the order of `unit.get_weights()`."""
        return [ops.convert_to_numpy(variable[index]) for variable in self._unit_order()]

    def set_unit_weights(self, index, weights):
        """Sets the weights of unit `index` from a list ordered as `unit.get_weights()`."""
        for variable, value in zip(self._unit_order(), weights, strict=True):
            start = [index] + [0] * (len(variable.shape) - 1)
            value = ops.expand_dims(ops.cast(value, variable.dtype), 0)
            variable.assign(ops.slice_update(variable.value, start, value))

    def stacked(self, variable):
        """The stacked variable that holds `variable` of the unit, for every unit."""
        stacked = self.stacked_trainable + self.stacked_non_trainable
        return next(twin for own, twin in zip(self._unit_variables(), stacked, strict=True) if own is variable)

    def _unit_variables(self):
        """The unit's own variables, in the order of the stacked ones."""
        return self.unit.trainable_variables + self.unit.non_trainable_variables

    def _unit_order(self):
        """The stacked variables in the order of the unit's own `weights`."""
        return [self.stacked(variable) for variable in self.unit.weights]

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        unit = keras.saving.serialize_keras_object(self.unit)
        unit.pop("build_config", None)
        config.update(unit=unit, count=self.count, rematerialize=self.rematerialize)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["unit"] = keras.saving.deserialize_keras_object(config["unit"])
        return cls(**config)
