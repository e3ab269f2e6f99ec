"""BatchNorm folded into the convolution before it: the same network in inference, fewer operations."""

import keras
import numpy as np
import pytest

import keras_preact
from keras_preact import base_layers
from tests.conftest import random_images
from tests.test_fused import UNIT_KINDS, network

# How many BatchNorms fold in the test networks (6 units: two per stage), counted from the
# figures: the stem's, then per basic unit of Fig. 4(a), (c) and (d) both, of (b) the first
# (the second reads the sum), of (e) the middle one (the first is the pre-activation, and
# the last convolution goes to the addition). A bottleneck unit has three convolutions, and
# the first unit of each stage a projection shortcut, with a BatchNorm of its own except in (e).
FOLDED = {
    ("preactivation", "basic"): 1 + 6 * 1,
    ("preactivation", "bottleneck"): 1 + 6 * 2,
    ("original", "basic"): 1 + 6 * 2,
    ("original", "bottleneck"): 1 + 6 * 3 + 3,
    ("bn_after_addition", "basic"): 1 + 6 * 1,
    ("bn_after_addition", "bottleneck"): 1 + 6 * 2 + 3,
    ("relu_before_addition", "basic"): 1 + 6 * 2,
    ("relu_before_addition", "bottleneck"): 1 + 6 * 3 + 3,
    ("relu_only_preactivation", "basic"): 1 + 6 * 2,
    ("relu_only_preactivation", "bottleneck"): 1 + 6 * 3 + 3,
}


def with_trained_statistics(model, seed=0):
    """`model` with BatchNorm weights and statistics far from their initial values, as after
    training (folding the initial ones, mean 0 and variance 1, would prove little)."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        name = variable.path.rsplit("/", 1)[-1]
        if name.endswith(("gamma", "moving_variance")):
            variable.assign(rng.uniform(0.5, 2.0, variable.shape).astype(variable.dtype))
        elif name.endswith(("beta", "moving_mean")):
            variable.assign(rng.normal(0.0, 0.5, variable.shape).astype(variable.dtype))
    return model


def inference(model, images):
    return keras.ops.convert_to_numpy(keras.ops.cast(model(images, training=False), "float32"))


# Every unit kind as separate units on every backend; as loops of bottleneck units on
# TensorFlow, and for the original unit (projections included) on every backend.
CASES = [
    pytest.param(
        unit,
        form,
        layout,
        id=f"{unit}-{form}-{layout}",
        marks=[pytest.mark.tensorflow] if layout == "loops" and unit != "original" else [],
    )
    for unit in UNIT_KINDS
    for form, layout in (("basic", "separate"), ("bottleneck", "loops"))
]


@pytest.mark.parametrize("unit, form, layout", CASES)
def test_folded_network_computes_the_same(unit, form, layout):
    model = with_trained_statistics(network(unit, form, scan_units=layout == "loops", classifier_activation=None))
    weights = [np.array(value) for value in model.get_weights()]
    folded = keras_preact.fold_batch_norms(model)
    images = random_images((3, 16, 16, 3), seed=1)
    expected = inference(model, images)
    # Float32 rounding: at most 1e-6 of the largest logit measured.
    np.testing.assert_allclose(inference(folded, images), expected, rtol=0, atol=1e-5 * np.abs(expected).max())
    assert folded.folded_batch_norms == FOLDED[(unit, form)]
    norms = [layer for layer in keras_preact.walks.batch_norms(folded)]
    assert sum(norm.folded for norm in norms) == FOLDED[(unit, form)]
    assert folded.trainable_weights == [] and folded.name == model.name
    assert [layer.name for layer in folded.layers] == [layer.name for layer in model.layers]
    for before, after in zip(weights, model.get_weights(), strict=True):  # the model itself is unchanged
        np.testing.assert_array_equal(before, after)
    assert not any(norm.folded for norm in keras_preact.walks.batch_norms(model))


def test_folded_weights_are_the_formula():
    """kernel * gamma / sqrt(variance + epsilon) per output channel; beta - mean * that scale."""
    kernel = np.arange(2 * 1 * 1 * 2 * 3, dtype="float32").reshape(2, 1, 1, 2, 3)  # two stacked 1x1 kernels
    gamma = np.array([[1.0, 2.0, 3.0], [0.5, 0.5, 0.5]], "float32")
    beta, mean = np.ones((2, 3), "float32"), np.full((2, 3), 2.0, "float32")
    variance = np.array([[3.0, 0.0, 8.0], [1.0, 1.0, 1.0]], "float32")
    folded_kernel, bias = keras_preact.folding.folded_weights(kernel, gamma, beta, mean, variance, epsilon=1.0)
    scale = np.array([[0.5, 2.0, 1.0], [0.5**1.5, 0.5**1.5, 0.5**1.5]], "float32")
    np.testing.assert_allclose(np.array(folded_kernel), kernel * scale[:, None, None, None, :], rtol=1e-6)
    np.testing.assert_allclose(np.array(bias), 1.0 - 2.0 * scale, rtol=1e-6)


def test_folded_mixed_bfloat16_network_computes_the_same():
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = with_trained_statistics(network("original", "bottleneck", scan_units=True, classifier_activation=None))
        folded = keras_preact.fold_batch_norms(model)
    finally:
        keras.config.set_dtype_policy("float32")
    images = random_images((3, 16, 16, 3), seed=1)
    expected = inference(model, images)
    # bfloat16 keeps 8 bits of mantissa: the two round apart by about 1e-2 of the largest logit
    # (measured 7e-3 on TensorFlow, 9e-3 on JAX).
    np.testing.assert_allclose(inference(folded, images), expected, rtol=0, atol=3e-2 * np.abs(expected).max())
    assert folded.folded_batch_norms == FOLDED[("original", "bottleneck")]


def test_a_network_that_is_not_a_chain_is_refused():
    inputs = keras.Input((8, 8, 3))
    convolved = base_layers.SymmetricConv2D(4, 3, name="conv")(inputs)
    outputs = keras.layers.Concatenate()([base_layers.batch_norm(0.0, "bn")(convolved), convolved])
    with pytest.raises(ValueError, match=r"layers form a chain.*Received: layer 'concatenate"):
        keras_preact.fold_batch_norms(keras.Model(inputs, outputs))
