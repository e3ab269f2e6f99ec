"""The merges of Fig. 2 and the shortcuts, on numbers worked out by hand."""

import keras
import numpy as np
import pytest

import keras_preact as kp
from keras_preact import shortcuts
from tests.conftest import random_images

SHORTCUT = np.full((1, 2, 2, 3), 2.0, "float32")
RESIDUAL = np.full((1, 2, 2, 3), 4.0, "float32")


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def with_zero_gate_kernel(gate):
    gate.build(SHORTCUT.shape, RESIDUAL.shape)
    gate.kernel.assign(np.zeros(gate.kernel.shape, "float32"))
    return gate


@pytest.mark.parametrize(
    "merge, expected",
    [
        (kp.Addition(), 6.0),
        (kp.NoShortcut(), 4.0),
        (kp.ConstantScaling(0.5, 1.0), 0.5 * 2 + 4),
        (kp.ConstantScaling(0.5, 0.5), 0.5 * 2 + 0.5 * 4),
        (with_zero_gate_kernel(kp.ExclusiveGating(-6.0)), sigmoid(-6) * 4 + (1 - sigmoid(-6)) * 2),
        (with_zero_gate_kernel(kp.ShortcutOnlyGating(-6.0)), 4 + (1 - sigmoid(-6)) * 2),
        (with_zero_gate_kernel(kp.ShortcutOnlyGating(0.0)), 4 + 0.5 * 2),
    ],
    ids=lambda value: type(value).__name__ if not isinstance(value, float) else "",
)
def test_merge_values(merge, expected):
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(merge(SHORTCUT, RESIDUAL)), np.full(SHORTCUT.shape, expected), rtol=1e-6
    )


def test_gate_reads_the_shortcut_through_a_1x1_convolution():
    gate = kp.ExclusiveGating(-1.0)
    shortcut, residual = random_images((2, 3, 3, 4)), random_images((2, 3, 3, 4), seed=1)
    gate.build(shortcut.shape, residual.shape)
    g = sigmoid(shortcut @ np.array(gate.kernel) - 1.0)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(gate(shortcut, residual)), g * residual + (1 - g) * shortcut, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_array_equal(np.array(gate.bias), np.full(4, -1.0))


def test_shortcut_dropout_drops_half_and_rescales_in_training_only():
    merge = kp.ShortcutDropout(0.5, seed=7)
    shortcut = np.ones((1, 32, 32, 8), "float32")
    residual = np.zeros_like(shortcut)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(merge(shortcut, residual, training=False)), shortcut)
    dropped = keras.ops.convert_to_numpy(merge(shortcut, residual, training=True))
    assert set(np.unique(dropped)) == {0.0, 2.0}
    assert 0.45 < (dropped == 0).mean() < 0.55


def test_zero_padding_shortcut_subsamples_and_appends_zero_channels():
    x = random_images((2, 8, 8, 16))
    padded = keras.ops.convert_to_numpy(shortcuts.ZeroPaddingShortcut(32, strides=2)(x))
    np.testing.assert_array_equal(padded[..., :16], x[:, ::2, ::2, :])
    np.testing.assert_array_equal(padded[..., 16:], 0.0)


@pytest.mark.parametrize(
    "factory, message",
    [
        (lambda: kp.ConstantScaling("half"), "shortcut_scale must be a finite number. Received: shortcut_scale='half'"),
        (
            lambda: kp.ConstantScaling(float("nan")),
            "shortcut_scale must be a finite number. Received: shortcut_scale=nan",
        ),
        (
            lambda: kp.ConstantScaling(0.5, True),
            "residual_scale must be a finite number. Received: residual_scale=True",
        ),
        (lambda: kp.ExclusiveGating(gate_bias=None), "gate_bias must be a finite number. Received: gate_bias=None"),
        (lambda: kp.ShortcutOnlyGating(gate_bias=float("-inf")), "Received: gate_bias=-inf"),
        (lambda: kp.ShortcutDropout(float("nan")), "rate must be a number in [0, 1). Received: rate=nan"),
        (lambda: kp.ShortcutDropout(1.5), "rate must be a number in [0, 1). Received: rate=1.5"),
        (lambda: shortcuts.ZeroPaddingShortcut(8)(random_images((1, 4, 4, 16))), "can only add channels"),
    ],
)
def test_invalid_merge_arguments(factory, message):
    with pytest.raises(ValueError) as error:
        factory()
    assert message in str(error.value)
