"""Stages run as loops over stacked weights: the same networks as with one layer per unit."""

import functools

import keras
import numpy as np
import pytest

import keras_preact
from keras_preact import merges, stacked, units, walks
from tests.conftest import dtype_policy, gradients, random_images
from tests.test_models import PARAMETER_COUNTS

NETWORKS = {
    "pre-activation ResNet-20": lambda **options: keras_preact.ResNet20(classes=10, **options),
    "original ResNet-20, projections": lambda **options: keras_preact.get_model(
        "resnet20_original", classes=10, shortcut="projection", **options
    ),
    "BN after addition, bottleneck ResNet-29": lambda **options: keras_preact.CifarResNet(
        29, "bottleneck", unit="bn_after_addition", classes=10, **options
    ),
    "exclusive gating, b_g = -2": lambda **options: keras_preact.ResNet20(
        classes=10, merge=merges.ExclusiveGating(gate_bias=-2), **options
    ),
    "ReLU-only pre-activation, single-layer units": lambda **options: keras_preact.CifarResNet(
        11, "single", unit="relu_only_preactivation", classes=10, **options
    ),
}


# Tolerances of float64 results: JAX's loops came within 1e-14 of each gradient's norm and
# 0.25 % of these bounds; TensorFlow's and PyTorch's equal the separate units' exactly.
FLOAT64_ROUNDING = dict(rtol=1e-10, atol=1e-12)


def twins(build, **options):
    """A network with separate units and the same network with stacked units, equal weights."""
    separate, looped = build(), build(scan_units=True, **options)
    keras_preact.copy_weights(separate, looped)
    return separate, looped


def weighted_sum(outputs):
    return keras.ops.sum(outputs * keras.ops.arange(1, 11, dtype=keras.backend.standardize_dtype(outputs.dtype)))


def as_separate_units(build, trainable_values):
    """`trainable_values` of the looped network, in the order of the separate network's variables."""
    carrier, separate = build(scan_units=True), build()
    for variable, value in zip(carrier.trainable_variables, trainable_values, strict=True):
        variable.assign(value)
    keras_preact.copy_weights(carrier, separate)
    return [np.array(variable) for variable in separate.trainable_variables]


def assert_close(received, expected, rtol=1e-4, atol=1e-5):
    """Equal but for float rounding (`atol` of the largest value): the loop's kernels may be
    fused differently."""
    scale = max(np.abs(value).max() for value in expected)
    for got, want in zip(received, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * scale)


@pytest.mark.parametrize("name", NETWORKS)
def test_the_loop_computes_the_network_of_separate_units(name):
    separate, looped = twins(NETWORKS[name])
    assert looped.count_params() == separate.count_params()
    assert any(isinstance(layer, stacked.StackedUnits) for layer in looped.layers)
    images = random_images((4, 32, 32, 3))
    for training in (False, True):
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(looped(images, training=training)),
            keras.ops.convert_to_numpy(separate(images, training=training)),
            rtol=1e-5,
            atol=1e-6,
        )


@pytest.mark.parametrize("rematerialize", [False, True], ids=["kept", "rematerialized"])
@pytest.mark.parametrize("name", NETWORKS)
def test_gradients_and_moving_statistics_equal_separate_units(name, rematerialize):
    """In float64, to its rounding on every backend. In float32 a difference of 1e-7 in a
    unit's output (the loop's kernels are fused differently from the separate units', and
    JAX's XLA fuses the loop's body) can move a ReLU input across zero where BatchNorm centres
    it, which changes a gradient by up to several percent, more or less often depending on
    the processor."""
    build = NETWORKS[name]
    with dtype_policy("float64"):
        separate, looped = twins(build, rematerialize=rematerialize)
        images = random_images((8, 32, 32, 3), seed=1).astype("float64")
        expected = gradients(separate, images, weighted_sum)
        received = gradients(looped, images, weighted_sum)
        assert all(gradient is not None for gradient in received)
        assert {gradient.dtype for gradient in received} == {np.dtype("float64")}
        assert_close(as_separate_units(build, received), expected, **FLOAT64_ROUNDING)
        # A training call updates each unit's moving averages once, as separate units do.
        separate(images, training=True)
        looped(images, training=True)
        back = build()
        keras_preact.copy_weights(looped, back)
        moving = [np.array(variable) for variable in separate.non_trainable_variables]
        assert_close([np.array(variable) for variable in back.non_trainable_variables], moving, **FLOAT64_ROUNDING)
        assert not np.allclose(moving[0], 0.0)


def test_a_frozen_loop_runs_its_units_in_inference_mode():
    model = keras_preact.ResNet20(classes=10, scan_units=True)
    stack = model.get_layer("stage2_units2to3")
    stack.trainable = False
    before = [np.array(variable) for variable in stack.weights]
    images = random_images((4, 16, 16, 32), seed=5)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(stack(images, training=True)),
        keras.ops.convert_to_numpy(stack(images, training=False)),
    )
    for want, variable in zip(before, stack.weights, strict=True):
        np.testing.assert_array_equal(np.array(variable), want)


def test_stacked_weights_are_initialised_unit_by_unit():
    model = keras_preact.ResNet110(scan_units=True, merge=merges.ExclusiveGating(gate_bias=-6))
    stack = model.get_layer("stage1_units2to18")
    assert stack.count == 17 and stack.unit.name == "stage1_unit2"
    kernels = np.array(stack.get_weights()[[w.name for w in stack.weights].index("conv2_kernel")])
    assert kernels.shape == (17, 3, 3, 16, 16)
    # He fan-out initialisation of each unit: std sqrt(2 / (3 * 3 * 16)), all units different.
    np.testing.assert_allclose(kernels.std(axis=(1, 2, 3, 4)).mean(), np.sqrt(2 / 144), rtol=0.03)
    assert len({kernel.tobytes() for kernel in kernels}) == 17
    weights = {variable.name: np.array(variable) for variable in stack.weights}
    np.testing.assert_array_equal(weights["merge_bias"], np.full((17, 16), -6.0, "float32"))
    np.testing.assert_array_equal(weights["bn1_moving_variance"], np.ones((17, 16), "float32"))


def test_weight_decay_is_the_separate_units_decay():
    separate, looped = twins(functools.partial(NETWORKS["exclusive gating, b_g = -2"], weight_decay=1e-4))
    assert len(looped.losses) < len(separate.losses)
    decay = float(sum(separate.losses))
    assert decay > 0
    np.testing.assert_allclose(float(sum(looped.losses)), decay, rtol=1e-5)


def test_resnet1001_holds_three_loops_and_its_parameter_count():
    model = keras_preact.ResNet1001()  # loops by default: 111 units per stage
    loops = [layer for layer in model.layers if isinstance(layer, stacked.StackedUnits)]
    assert [loop.name for loop in loops] == ["stage1_units2to111", "stage2_units2to111", "stage3_units2to111"]
    total, trainable = PARAMETER_COUNTS["resnet1001"]
    assert model.count_params() == total
    assert sum(int(np.prod(variable.shape)) for variable in model.trainable_variables) == trainable
    assert len(model.weights) == 100  # against 5,005 with one layer per unit


def test_keras_save_and_load_keep_the_loop(tmp_path):
    _, looped = twins(NETWORKS["original ResNet-20, projections"], rematerialize=True)
    path = str(tmp_path / "looped.keras")
    looped.save(path)
    loaded = keras.saving.load_model(path)
    stack = loaded.get_layer("stage2_units2to3")
    assert isinstance(stack, stacked.StackedUnits) and stack.rematerialize and stack.count == 2
    images = random_images((2, 32, 32, 3), seed=3)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(loaded(images)), keras.ops.convert_to_numpy(looped(images))
    )


def test_copy_weights_round_trips_and_refuses_another_network():
    separate, looped = twins(NETWORKS["pre-activation ResNet-20"])
    back = keras_preact.ResNet20(classes=10)
    keras_preact.copy_weights(looped, back)
    for want, got in zip(separate.get_weights(), back.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match=r"resnet20 has no layers \['stage1_unit4', 'stage1_unit5'\]"):
        keras_preact.copy_weights(separate, keras_preact.ResNet32(classes=10, scan_units=True))


@pytest.mark.parametrize(
    "build, message",
    [
        (
            lambda: keras_preact.ResNet20(scan_units="yes"),
            r"scan_units must be True, False or None \(loops for the deepest networks\). Received: scan_units='yes'",
        ),
        (
            lambda: stacked.StackedUnits(units.PreActivationUnit(16, strides=2, shortcut="projection"), 3),
            "unit must keep its input's shape",
        ),
        (
            lambda: stacked.StackedUnits(units.PreActivationUnit(16), 0),
            "count must be a positive integer. Received: count=0",
        ),
        (lambda: stacked.StackedUnits("stage1_unit2", 3), "unit must be an unbuilt residual unit"),
        (
            lambda: stacked.StackedUnits(units.PreActivationUnit(16, form="bottleneck", shortcut="projection"), 3)(
                keras.Input((8, 8, 16))
            ),
            r"maps \(None, 8, 8, 16\) to \(None, 8, 8, 64\)",
        ),
        (
            lambda: keras_preact.ResNet20(scan_units=True, merge=merges.ShortcutDropout()),
            "random state such as ShortcutDropout's cannot be stacked",
        ),
    ],
    ids=["not a bool", "strided unit", "no units", "not a unit", "changes width", "shortcut dropout"],
)
def test_bad_arguments_raise_clear_errors(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.large
def test_loops_by_default_only_where_a_stage_has_100_units():
    """`scan_units=None`: loops for ResNet-1001 and ResNet-1202, where separate units take
    minutes to the first step; separate units up to ImageNet's 36 units per stage, and for
    ShortcutDropout, which cannot be stacked."""

    def looped(architecture, merge=None):
        return keras_preact.models.loops_by_default(keras_preact.ARCHITECTURES[architecture], merge)

    assert [name for name in keras_preact.ARCHITECTURES if looped(name)] == ["resnet1001", "resnet1202"]
    assert not looped("resnet1001", merges.ShortcutDropout(0.5))
    assert looped("resnet1001", merges.ExclusiveGating(gate_bias=-6))
    loops = [layer for layer in keras_preact.ResNet1202().layers if isinstance(layer, stacked.StackedUnits)]
    assert [loop.count for loop in loops] == [199, 199, 199]
    assert not any(isinstance(layer, stacked.StackedUnits) for layer in keras_preact.ResNet164().layers)
    dropout = keras_preact.ResNet1001(unit="original", merge=merges.ShortcutDropout(0.5))
    assert dropout.get_layer("stage3_unit111") is not None


@pytest.mark.parametrize("saved_with_loops", [True, False], ids=["loops into separate", "separate into loops"])
def test_a_weights_file_loads_into_either_layout(tmp_path, saved_with_loops):
    separate, looped = twins(NETWORKS["original ResNet-20, projections"])
    path = str(tmp_path / "network.weights.h5")
    (looped if saved_with_loops else separate).save_weights(path)
    build = NETWORKS["original ResNet-20, projections"]
    loaded = build(weights=path, scan_units=saved_with_loops is False)
    assert any(isinstance(layer, stacked.StackedUnits) for layer in loaded.layers) is not saved_with_loops
    # The weights first: a call in training mode moves BatchNorm's statistics, by float rounding
    # differently in a loop on JAX.
    for want, got in zip(keras_preact.separate_units(loaded).get_weights(), separate.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    images = random_images((4, 32, 32, 3), seed=5)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(loaded(images, training=True)),
        keras.ops.convert_to_numpy(separate(images, training=True)),
        rtol=1e-5,
        atol=1e-6,
    )


def test_a_weights_file_of_another_network_fits_neither_layout(tmp_path):
    path = str(tmp_path / "resnet32.weights.h5")
    keras_preact.ResNet32(classes=10).save_weights(path)
    with pytest.raises(ValueError, match=f"Could not load the weights file {path} into resnet20"):
        keras_preact.ResNet20(classes=10, weights=path)


def test_analysis_measures_looped_units_one_by_one_and_reaches_their_batch_norms():
    separate, model = twins(NETWORKS["pre-activation ResNet-20"])
    assert [unit.name for unit in keras_preact.analysis.residual_units(model)] == [
        f"stage{stage}_unit{index}" for stage in (1, 2, 3) for index in (1, 2, 3)
    ]
    assert [unit.name for unit in keras_preact.analysis.stage_units(model, 2)] == ["stage2_unit2", "stage2_unit3"]
    images, labels = random_images((4, 32, 32, 3), seed=6), np.arange(4)
    for got, want in zip(
        keras_preact.analysis.propagation(model, images, labels),
        keras_preact.analysis.propagation(separate, images, labels),
        strict=True,
    ):
        assert got.name == want.name
        np.testing.assert_allclose(
            [got.output_norm, got.input_gradient_norm, got.weight_gradient_norm],
            [want.output_norm, want.input_gradient_norm, want.weight_gradient_norm],
            rtol=1e-4,
        )
    assert keras_preact.separate_units(separate) is separate
    norms = walks.batch_norms(model)
    assert len(norms) == len(walks.batch_norms(keras_preact.ResNet20(classes=10))) - 3 * 2  # a unit less per stage
    # Statistics set from a batch: inference then equals training mode, loops included, up
    # to the moving variance's Bessel correction (n / (n - 1), n >= 16 x 8 x 8: 0.1 % per
    # BatchNorm; 0.44 % measured at the outputs).
    images = random_images((16, 32, 32, 3), seed=4)
    keras_preact.analysis.set_batch_norm_statistics(model, images)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(model(images, training=False)),
        keras.ops.convert_to_numpy(model(images, training=True)),
        rtol=1e-2,
        atol=1e-5,
    )


@pytest.mark.tensorflow
def test_training_checkpoints_restore_the_stacked_weights(tmp_path):
    """The training loop's checkpoint holds the loops' variables: a resumed run gets them back."""
    from keras_preact_training.train import checkpoints

    trained = keras_preact.ResNet20(classes=10, scan_units=True)
    trained(random_images((4, 32, 32, 3)), training=True)  # moving statistics away from 0 and 1
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9, name="sgd")
    optimizer.build(trained.trainable_variables)
    path = checkpoints.save(str(tmp_path), 0, checkpoints.state(trained, optimizer))
    fresh = keras_preact.ResNet20(classes=10, scan_units=True)
    fresh_optimizer = keras.optimizers.SGD(0.1, momentum=0.9, name="sgd")  # variables named as in a new process
    fresh_optimizer.build(fresh.trainable_variables)
    checkpoints.load(
        fresh, fresh_optimizer, checkpoints.read(path, checkpoints.variables_by_key(fresh, fresh_optimizer))
    )
    for want, got in zip(trained.variables, fresh.variables, strict=True):
        np.testing.assert_array_equal(np.array(got), np.array(want), err_msg=want.path)


@pytest.mark.parametrize("scan_units", [False, True], ids=["separate", "loops"])
def test_moving_statistics_are_every_batch_norm_statistic_of_the_model(scan_units):
    """What the training loop averages over replicas: in loops, the stacked variables."""
    model = keras_preact.ResNet20(classes=10, scan_units=scan_units)
    found = walks.moving_statistics(model)
    expected = [
        variable
        for variable in model.non_trainable_variables
        if variable.name.startswith("moving_") or "_moving_" in variable.name
    ]
    assert len(found) == len(expected) == (38 if not scan_units else 26)
    assert {id(variable) for variable in found} == {id(variable) for variable in expected}
