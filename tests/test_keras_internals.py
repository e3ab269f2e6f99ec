"""The one Keras internal the library relies on where Keras has no public API, named: this
fails, saying which, where a Keras version changes it. (`keras_preact_training.train.recipe.CoupledSGD`'s
optimizer methods have their own test in tests/test_weight_decay.py.)

`Layer._flatten_layers` walks a layer's nested layers: `StackedUnits` (keras_preact/stacked.py)
stacks the variables of its unit's layers by their paths, the model-wide walks
(keras_preact/walks.py) reach the layers inside a loop of units, and a unit lists its BatchNorms with it.
Keras 3 offers no public walk over the layers nested in a layer (`Model.layers` is the top
level alone).
"""

import keras

import keras_preact
from keras_preact import base_layers, merges


def test_layer_flatten_layers_walks_a_units_nested_layers_from_itself():
    unit = keras_preact.PreActivationUnit(16, merge=keras_preact.ExclusiveGating(-2))
    unit.build((None, 8, 8, 16))
    assert hasattr(unit, "_flatten_layers"), "keras.layers.Layer._flatten_layers is gone"
    walked = list(unit._flatten_layers())
    assert walked[0] is unit
    assert sum(isinstance(layer, base_layers.BatchNorm) for layer in walked) == 2
    assert sum(isinstance(layer, merges.ExclusiveGating) for layer in walked) == 1
    assert unit not in list(unit._flatten_layers(include_self=False))
    assert unit.all_batch_norms() == [layer for layer in walked if isinstance(layer, base_layers.BatchNorm)]


def test_a_models_walk_reaches_the_layers_of_its_units():
    model = keras_preact.ResNet20()
    walked = list(model._flatten_layers(include_self=False))
    norms = [layer for layer in walked if isinstance(layer, keras.layers.BatchNormalization)]
    moving_means = [variable for variable in model.non_trainable_variables if variable.path.endswith("moving_mean")]
    assert len(norms) == len(moving_means) == 19
