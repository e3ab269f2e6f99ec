"""The paper's weight decay: a coupled L2 term, as in Caffe and the official Torch code."""

import keras
import numpy as np
import pytest

import keras_preact as kp
from tests.conftest import gradients, random_images

LEARNING_RATE, MOMENTUM = 0.1, 0.9
# Far larger than the paper's 1e-4, so that the decay's share of an update stands well
# above float32 round-off and the test tells coupled, decoupled and no decay apart.
DECAY = 0.05
INPUTS, LABELS = random_images((4, 8, 8, 3)), np.array([0, 1, 2, 1])


def tiny_network(weight_decay):
    return kp.CifarResNet(8, input_shape=(8, 8, 3), classes=3, classifier_activation=None, weight_decay=weight_decay)


def hand_update(initial, decay, steps=2):
    """Torch's optim.sgd with weight decay: v <- m v - lr (g + decay w); w <- w + v."""
    network = tiny_network(0.0)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    weights, velocity = list(initial), [np.zeros_like(w) for w in initial]
    for _ in range(steps):
        for variable, value in zip(network.trainable_variables, weights):
            variable.assign(value)
        data_gradients = gradients(network, INPUTS, lambda logits: loss(LABELS, logits))
        velocity = [MOMENTUM * v - LEARNING_RATE * (g + decay * w) for v, g, w in zip(velocity, data_gradients, weights)]
        weights = [w + v for w, v in zip(weights, velocity)]
    return weights


def train(model, optimizer, steps=2):
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    for _ in range(steps):
        model.train_on_batch(INPUTS, LABELS)
    return [np.array(variable) for variable in model.trainable_variables]


def largest_difference(first, second):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(first, second))


def test_regularization_loss_is_half_the_decay_times_the_squared_weights():
    model = tiny_network(1e-4)
    model(INPUTS)
    assert len(model.losses) == len(model.trainable_variables)
    squared = sum(float(np.sum(np.square(variable))) for variable in model.trainable_variables)
    assert float(sum(model.losses)) == pytest.approx(0.5e-4 * squared, rel=1e-5)


def test_sgd_momentum_steps_match_the_coupled_update_by_hand():
    model = tiny_network(DECAY)
    initial = [np.array(variable) for variable in model.trainable_variables]
    trained = train(model, keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM))
    expected = hand_update(initial, DECAY)
    assert largest_difference(trained, expected) < 1e-5
    # The decay's share of the update is far above that tolerance.
    assert largest_difference(expected, hand_update(initial, 0.0)) > 1e-3


def test_keras_decoupled_weight_decay_is_a_different_update():
    coupled = tiny_network(DECAY)
    initial = [np.array(variable) for variable in coupled.trainable_variables]
    decoupled = tiny_network(0.0)
    decoupled.set_weights(coupled.get_weights())
    trained = train(decoupled, keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM, weight_decay=DECAY))
    assert largest_difference(trained, hand_update(initial, DECAY)) > 1e-3
