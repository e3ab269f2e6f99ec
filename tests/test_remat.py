"""Rematerialized units: the same gradients and BatchNorm statistics as without, on every backend."""

import keras
import numpy as np
import pytest

import keras_preact
from keras_preact import base_layers
from tests.conftest import gradients, random_images

NETWORKS = {
    "pre-activation ResNet-20": lambda rematerialize: keras_preact.ResNet20(rematerialize=rematerialize, classes=10),
    "original ResNet-20, projections": lambda rematerialize: keras_preact.get_model(
        "resnet20_original", rematerialize=rematerialize, classes=10, shortcut="projection"
    ),
    "BN after addition, bottleneck ResNet-29": lambda rematerialize: keras_preact.CifarResNet(
        29, "bottleneck", unit="bn_after_addition", rematerialize=rematerialize, classes=10
    ),
}


def twins(build):
    plain, rematerialized = build(False), build(True)
    rematerialized.set_weights(plain.get_weights())
    return plain, rematerialized


def weighted_sum(outputs):
    return keras.ops.sum(outputs * keras.ops.arange(1, 11, dtype="float32"))


@pytest.mark.parametrize("name", NETWORKS)
def test_gradients_equal_the_plain_network(name):
    plain, rematerialized = twins(NETWORKS[name])
    images = random_images((8, 32, 32, 3))
    expected, received = gradients(plain, images, weighted_sum), gradients(rematerialized, images, weighted_sum)
    assert len(received) == len(plain.trainable_variables) and all(gradient is not None for gradient in received)
    if keras.backend.backend() == "tensorflow":
        for want, got in zip(expected, received):  # the same kernels run again: bit for bit
            np.testing.assert_array_equal(got, want)
    else:  # XLA may fuse the recomputed forward pass differently: float rounding only
        scale = max(np.abs(want).max() for want in expected)
        for want, got in zip(expected, received):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize("name", NETWORKS)
def test_moving_statistics_update_once_as_without(name):
    """After a training step, gradient and recomputation included, and a second forward
    pass, every BatchNorm's moving mean and variance equal the plain network's, to
    float32 rounding: on TensorFlow the plain network's fused kernel averages them itself,
    the rematerialized one's are averaged after the recomputation (an update counted
    twice would be off by a tenth of the batch statistics)."""
    plain, rematerialized = twins(NETWORKS[name])
    images = random_images((8, 32, 32, 3), seed=1)
    gradients(plain, images, weighted_sum)
    gradients(rematerialized, images, weighted_sum)
    plain(images, training=True)
    rematerialized(images, training=True)
    moving = [(variable.path, np.array(variable)) for variable in plain.non_trainable_variables]
    assert len(moving) == len(rematerialized.non_trainable_variables) > 0
    for (path, want), variable in zip(moving, rematerialized.non_trainable_variables):
        np.testing.assert_allclose(np.array(variable), want, rtol=1e-6, atol=0, err_msg=path)
    # They moved: one update from 0 and 1 would not leave them there.
    assert not np.allclose(moving[0][1], 0.0)


def test_inference_is_not_rematerialized_and_equal():
    plain, rematerialized = twins(NETWORKS["pre-activation ResNet-20"])
    images = random_images((2, 32, 32, 3), seed=2)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(rematerialized(images)), keras.ops.convert_to_numpy(plain(images))
    )


def test_units_use_collecting_batch_norms_and_keep_the_option_in_their_config():
    model = keras_preact.ResNet20(rematerialize=True)
    unit = model.get_layer("stage2_unit1")
    assert unit.rematerialize and unit.get_config()["rematerialize"] is True
    assert all(isinstance(norm, base_layers.BatchNorm) for norm in unit.all_batch_norms())
    assert keras.layers.deserialize(keras.layers.serialize(unit)).rematerialize is True


def test_bad_rematerialize_is_a_clear_error():
    with pytest.raises(ValueError, match="rematerialize must be True or False. Received: rematerialize='yes'"):
        keras_preact.units.PreActivationUnit(16, rematerialize="yes")
