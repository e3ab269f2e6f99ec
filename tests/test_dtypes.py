"""Every dtype policy of Keras: a network builds, trains a step with the paper's recipe and
exports as a SavedModel under float64, float32, mixed_float16 and mixed_bfloat16."""

import keras
import numpy as np
import pytest

import keras_preact
from keras_preact_training import export
from keras_preact_training.train import named_configs, recipe
from tests.conftest import dtype_policy, random_images

pytestmark = pytest.mark.tensorflow  # SavedModel export

# policy -> (the weights' dtype, the layers' compute dtype, the exported logits' largest
# difference from the network's own, relative to the largest logit: float rounding in
# float64 and float32, the policy's own rounding of activations in float16 and bfloat16,
# measured 4e-8, 5e-7, 1.2e-3 and 5.1e-3; the folded export rounds its products once).
POLICIES = {
    "float64": ("float64", "float64", 1e-5),
    "float32": ("float32", "float32", 1e-5),
    "mixed_float16": ("float32", "float16", 1e-2),
    "mixed_bfloat16": ("float32", "bfloat16", 5e-2),
}
CONFIG = named_configs.CONFIGS["cifar10_cpu"]
IMAGES, LABELS = random_images((8, 32, 32, 3), seed=5), np.arange(8) % 10


def network():
    return keras_preact.ResNet20(input_shape=(32, 32, 3), classes=10, classifier_activation=None, weight_decay=1e-4)


def train_step(model, policy):
    """One step of the recipe's optimizer (loss-scaled under mixed_float16, as `keras_preact_training.train.recipe` does)."""
    config = CONFIG.override(f"precision={policy if policy.startswith('mixed') else 'float32'}")
    model.compile(recipe.optimizer(config, 390, model), recipe.loss())
    return float(model.train_on_batch(IMAGES, LABELS))


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_builds_trains_a_step_and_exports(policy, tmp_path):
    import tensorflow as tf

    weight_dtype, compute_dtype, tolerance = POLICIES[policy]
    with dtype_policy(policy):
        model = network()
        initial = [np.array(variable) for variable in model.trainable_variables]
        loss = train_step(model, policy)
        assert np.isfinite(loss), policy
        assert {variable.dtype for variable in model.trainable_variables} == {weight_dtype}
        assert model.get_layer("stem_conv").compute_dtype == compute_dtype
        assert all(
            not np.array_equal(before, np.array(after)) for before, after in zip(initial, model.trainable_variables)
        )
        expected = np.array(model(IMAGES, training=False), "float64")
        path = export.export_saved_model(
            model,
            str(tmp_path / "model"),
            [str(index) for index in range(10)],
            export.Preprocessing(32, 3, (0.0,) * 3, (1.0,) * 3),
            verbose=False,
        )
    outputs = tf.saved_model.load(path).signatures["predict_normalized"](normalized=tf.constant(IMAGES))
    logits = np.array(outputs["logits"], "float64")
    assert outputs["logits"].dtype == tf.float32
    assert np.max(np.abs(logits - expected)) <= tolerance * np.max(np.abs(expected)), policy


def update_relative_difference(model, reference, initial):
    """||update - reference's update|| / ||reference's update||, over all trainable weights."""
    update, expected = (
        np.concatenate(
            [
                (np.array(variable, "float64") - start).ravel()
                for variable, start in zip(network.trainable_variables, initial)
            ]
        )
        for network in (model, reference)
    )
    return np.linalg.norm(update - expected) / np.linalg.norm(expected)


def test_float64_trains_as_float32_to_rounding():
    """The same weights and batch: float64's step (the portable BatchNorm path) lands where
    float32's (the fused kernel) does, to float32's rounding. Compared as the whole step's
    update, since a BatchNorm's beta moves by about 1e-4 in the first step and float32's
    rounding of its gradient is a percent of that (measured 1.7e-6 absolute)."""
    reference = network()
    weights = reference.get_weights()
    initial = [np.array(variable, "float64") for variable in reference.trainable_variables]
    train_step(reference, "float32")
    with dtype_policy("float64"):
        model = network()
        model.set_weights([weight.astype("float64") for weight in weights])
        train_step(model, "float64")
        norms = keras_preact.walks.batch_norms(model)
        assert norms and not any(
            norm.runs_fused_kernel(keras.ops.zeros((1, 2, 2, norm.gamma.shape[0]), "float64")) for norm in norms
        )
        logits = np.array(model(IMAGES.astype("float64"), training=False))
    # Measured 2.8e-5 (this seed), 2.4e-5 to 2.1e-3 over seeds 1-3: float32 rounding that moves a
    # ReLU's input across zero changes that unit's gradient, as in tests/test_fused.py.
    assert update_relative_difference(model, reference, initial) < 5e-3
    expected = np.array(reference(IMAGES, training=False), "float64")
    np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-4 * np.max(np.abs(expected)))  # measured 1.6e-5
