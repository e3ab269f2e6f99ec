"""BatchNorm's fused TensorFlow kernel against its portable keras.ops path: the same networks."""

import keras
import numpy as np
import pytest

import keras_preact
from keras_preact import base_layers, defaults, walks
from tests.conftest import dtype_policy, gradients, random_images

UNIT_KINDS = ["preactivation", "original", "bn_after_addition", "relu_before_addition", "relu_only_preactivation"]


def network(unit, form="basic", **options):
    """The smallest CIFAR network with two units per stage (so that loops have a unit to loop over)."""
    depth = {"basic": 14, "bottleneck": 20}[form]
    return keras_preact.CifarResNet(depth, form, unit=unit, classes=10, input_shape=(16, 16, 3), **options)


def weighted_sum(outputs):
    return keras.ops.sum(keras.ops.cast(outputs, "float32") * keras.ops.arange(1, 11, dtype="float32"))


def one_step(model, images, fused):
    """Training-mode outputs, the gradient of every weight, the moving statistics after the
    two training passes, and inference-mode outputs, with every BatchNorm `fused` or not;
    the weights are put back after."""
    walks.set_fused(model, fused)
    initial = model.get_weights()
    outputs = [keras.ops.convert_to_numpy(model(images, training=True)).astype("float32")]
    grads = gradients(model, images, weighted_sum)
    moving = [np.array(variable) for variable in walks.moving_statistics(model)]
    inference = [keras.ops.convert_to_numpy(model(images, training=False)).astype("float32")]
    model.set_weights(initial)
    return dict(outputs=outputs, gradients=grads, moving_statistics=moving, inference=inference)


def assert_same_to_rounding(received, expected):
    """Outputs and statistics to 1e-5 of each array's largest value (at most 9e-7 measured).
    Gradients: a difference of 1e-7 in a BatchNorm output can move a ReLU input across
    zero, where BatchNorm centres them; each gradient is held to 5 % of its own norm (at
    most 2 % measured, in the units below the crossing), or to rounding where it is
    about zero (a path that computed another function is off by the whole gradient)."""
    for kind in ("outputs", "moving_statistics", "inference"):
        for index, (got, want) in enumerate(zip(received[kind], expected[kind], strict=True)):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max(), err_msg=f"{kind}[{index}]")
    scale = max(np.abs(want).max() for want in expected["gradients"])
    for index, (got, want) in enumerate(zip(received["gradients"], expected["gradients"], strict=True)):
        assert np.linalg.norm(got - want) <= 0.05 * np.linalg.norm(want) + 1e-5 * scale * np.sqrt(want.size), index


def largest_relative_errors(received, reference):
    return {
        kind: max(
            np.linalg.norm(got - want) / np.linalg.norm(want)
            for got, want in zip(received[kind], reference[kind], strict=True)
        )
        for kind in reference
    }


CASES = [
    (unit, "basic", layout, remat) for unit in UNIT_KINDS for layout in ("separate", "loops") for remat in (False, True)
] + [("preactivation", "bottleneck", "loops", True)]


def case_id(case):
    return "-".join([case[0], case[1], case[2], "remat" if case[3] else "plain"])


@pytest.mark.tensorflow
@pytest.mark.parametrize("unit, form, layout, rematerialize", CASES, ids=[case_id(case) for case in CASES])
def test_fused_equals_portable(unit, form, layout, rematerialize):
    model = network(unit, form, scan_units=layout == "loops", rematerialize=rematerialize)
    images = random_images((4, 16, 16, 3), seed=3)
    portable = one_step(model, images, False)
    fused = one_step(model, images, True)
    assert all(gradient is not None for gradient in fused["gradients"])
    assert_same_to_rounding(fused, portable)
    # The step moved the statistics: comparing initial values would prove nothing.
    assert not np.allclose(portable["moving_statistics"][0], 0.0)


BFLOAT16_CASES = [("preactivation", "basic", "separate", False), ("original", "bottleneck", "loops", True)]


@pytest.mark.tensorflow
@pytest.mark.parametrize(
    "unit, form, layout, rematerialize", BFLOAT16_CASES, ids=[case_id(case) for case in BFLOAT16_CASES]
)
def test_fused_is_as_close_to_float32_as_portable_under_mixed_bfloat16(unit, form, layout, rematerialize):
    """bfloat16 rounds each activation to 8 bits: both paths then differ from float32 by far
    more than from each other (outputs 0.5-1.4 %, gradients up to 68 % at initialisation
    measured, alike for the two); the fused path may not be further off than the portable one."""
    options = dict(scan_units=layout == "loops", rematerialize=rematerialize)
    images = random_images((4, 16, 16, 3), seed=3)
    reference = network(unit, form, **options)
    float32 = one_step(reference, images, False)
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = network(unit, form, **options)
    finally:
        keras.config.set_dtype_policy("float32")
    model.set_weights(reference.get_weights())
    assert model.get_layer("stem_conv").compute_dtype == "bfloat16"
    portable = largest_relative_errors(one_step(model, images, False), float32)
    fused = largest_relative_errors(one_step(model, images, True), float32)
    for kind in float32:
        assert fused[kind] <= 1.25 * portable[kind] + 1e-3, (kind, fused[kind], portable[kind])


def test_the_fused_kernel_runs_on_tensorflow_only_where_it_applies():
    norm = base_layers.batch_norm(1e-4, "bn")
    images = random_images((2, 4, 4, 3))
    norm.build(images.shape)
    assert norm.runs_fused_kernel(images) == (keras.backend.backend() == "tensorflow")
    assert not norm.runs_fused_kernel(random_images((2, 3)))  # not a 4-D image batch
    norm.synchronized = True  # statistics over replicas: the fused kernel cannot pool them
    assert not norm.runs_fused_kernel(images)
    norm.synchronized = False
    norm.fused = False
    assert not norm.runs_fused_kernel(images)
    assert base_layers.BatchNorm.from_config(norm.get_config()).fused is False  # the setting is saved


@pytest.mark.tensorflow
@pytest.mark.parametrize("fused", [True, False])
def test_the_traced_graph_holds_the_fused_kernel_or_not(fused):
    import tensorflow as tf

    model = network("preactivation")
    assert walks.set_fused(model, fused) == 13  # the stem's, 2 x 6 units' (of 2 each, less the first) and the final
    for training in (True, False):
        graph = (
            tf.function(lambda images, training=training: model(images, training=training))
            .get_concrete_function(tf.TensorSpec((None, 16, 16, 3)))
            .graph
        )
        kinds = {operation.type for operation in graph.get_operations()}
        assert ("FusedBatchNormV3" in kinds) == fused, training


@pytest.mark.tensorflow
@pytest.mark.parametrize("policy, kernel_dtype", [("mixed_bfloat16", "bfloat16"), ("mixed_float16", "float32")])
def test_the_fused_kernel_reads_bfloat16_activations_as_they_are(policy, kernel_dtype):
    """Under mixed_bfloat16 every BatchNorm's kernel, forward and gradient, takes the bfloat16
    activations themselves (it computes in float32 inside; no casts to float32 and back around
    it, which doubled its time); float16 ones are still cast to float32 around it."""
    import tensorflow as tf

    keras.config.set_dtype_policy(policy)
    try:
        model = network("preactivation")
    finally:
        keras.config.set_dtype_policy("float32")

    def step(images):
        with tf.GradientTape() as tape:
            loss = weighted_sum(model(images, training=True))
        return tape.gradient(loss, model.trainable_variables)

    graph = tf.function(step).get_concrete_function(tf.TensorSpec((2, 16, 16, 3))).graph
    kernels = [operation for operation in graph.get_operations() if operation.type.startswith("FusedBatchNorm")]
    assert {operation.type for operation in kernels} == {"FusedBatchNormV3", "FusedBatchNormGradV3"}
    assert {operation.get_attr("T").name for operation in kernels} == {kernel_dtype}
    assert len([operation for operation in kernels if operation.type == "FusedBatchNormV3"]) == 13


def test_moving_variance_is_unbiased_on_every_path():
    """Torch's (and the fused kernel's) running variance: the batch variance with Bessel's
    correction; the batch is normalized with the biased one."""
    images = np.random.default_rng(0).normal(2.0, 3.0, size=(4, 5, 5, 3)).astype("float32")
    for fused in (True, False):
        norm = base_layers.batch_norm(0.0, "bn")
        norm.fused = fused
        outputs = keras.ops.convert_to_numpy(norm(images, training=True))
        values = images.reshape(-1, 3)
        np.testing.assert_allclose(np.array(norm.moving_mean), 0.1 * values.mean(0), rtol=1e-5)
        np.testing.assert_allclose(np.array(norm.moving_variance), 0.9 + 0.1 * values.var(0, ddof=1), rtol=1e-5)
        expected = (images - values.mean(0)) / np.sqrt(values.var(0) + defaults.BATCH_NORM_EPSILON)
        np.testing.assert_allclose(outputs, expected, rtol=1e-4, atol=1e-4)


def test_float64_inputs_are_normalized_in_float64_on_every_backend():
    """Statistics, normalization and moving averages of float64 inputs in float64 arithmetic:
    to float64 rounding (in float32 arithmetic these outputs differ by up to 1.4e-5). Keras'
    `result_type("float64", "float32")` is float32 outside TensorFlow, so the layer does not
    take its compute dtype from it."""
    images = np.random.default_rng(0).normal(2.0, 3.0, size=(4, 5, 5, 3))
    values = images.reshape(-1, 3)
    with dtype_policy("float64"):
        norm = base_layers.batch_norm(0.0, "bn")
        outputs = keras.ops.convert_to_numpy(norm(images, training=True))
        assert outputs.dtype == np.float64
        expected = (images - values.mean(0)) / np.sqrt(values.var(0) + defaults.BATCH_NORM_EPSILON)
        np.testing.assert_allclose(outputs, expected, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.array(norm.moving_mean), 0.1 * values.mean(0), rtol=1e-12)
        np.testing.assert_allclose(np.array(norm.moving_variance), 0.9 + 0.1 * values.var(0, ddof=1), rtol=1e-12)
        inference = keras.ops.convert_to_numpy(norm(images, training=False))
        moving_mean, moving_variance = np.array(norm.moving_mean), np.array(norm.moving_variance)
        expected = (images - moving_mean) / np.sqrt(moving_variance + defaults.BATCH_NORM_EPSILON)
        np.testing.assert_allclose(inference, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.tensorflow
def test_float64_networks_train_and_equal_float32_to_rounding():
    """Under `keras.config.set_floatx("float64")` BatchNorm takes the portable path (the fused
    kernel takes float32 only): the network trains a step, and its outputs equal the float32
    network's with the same weights to float32 rounding. (JAX computes float64 only with
    `JAX_ENABLE_X64=1`; without it, JAX's arrays stay float32.)"""
    images = random_images((4, 16, 16, 3))
    single = network("preactivation")
    single(images, training=True)  # moving statistics away from 0 and 1
    previous = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")  # where a test before set a global policy
    try:
        double = network("preactivation")
        double.set_weights([weight.astype("float64") for weight in single.get_weights()])
        assert {weight.dtype for weight in double.weights} == {"float64"}
        for training in (False, True):
            expected = keras.ops.convert_to_numpy(single(images, training=training))
            received = keras.ops.convert_to_numpy(double(images.astype("float64"), training=training))
            assert received.dtype == np.float64
            np.testing.assert_allclose(received, expected, atol=1e-5 * np.abs(expected).max())
        double.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
        loss = double.train_on_batch(images.astype("float64"), np.arange(4))
        assert np.isfinite(loss)
    finally:
        keras.config.set_floatx(previous[0])
        keras.config.set_dtype_policy(previous[1])
