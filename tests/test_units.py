"""Residual units: the paper's identity property, each figure's order of operations,
serialization, shapes, training and mixed precision."""

import json

import keras
import numpy as np
import pytest
from keras import ops

import keras_preact as kp
from keras_preact import units
from tests.conftest import config_round_trip, jacobian, random_images

# (id, unit class, constructor arguments, input channels): every unit kind in every
# form, plus the shape-changing units and each merge.
UNIT_CASES = (
    [
        (f"{name}-{form}", cls, dict(filters=4 if form == "bottleneck" else 16, form=form), 16)
        for name, cls in units.UNITS.items()
        for form in units.FORMS
    ]
    + [
        (
            "preactivation-zero_pad-stride2-shared",
            units.PreActivationUnit,
            dict(filters=32, strides=2, shortcut="zero_pad", preactivation="shared"),
            16,
        ),
        (
            "preactivation-bottleneck-projection-first-none",
            units.PreActivationUnit,
            dict(filters=16, form="bottleneck", shortcut="projection", preactivation="none"),
            16,
        ),
        (
            "preactivation-bottleneck-projection-3x3-stride2",
            units.PreActivationUnit,
            dict(
                filters=8,
                form="bottleneck",
                strides=2,
                shortcut="projection",
                stride_on="3x3",
                preactivation="shared",
                weight_decay=1e-4,
            ),
            16,
        ),
        ("original-zero_pad-stride2", units.OriginalUnit, dict(filters=32, strides=2, shortcut="zero_pad"), 16),
        ("original-projection-every-unit", units.OriginalUnit, dict(filters=16, shortcut="projection"), 16),
        (
            "relu_only_preactivation-shared-projection",
            units.ReLUOnlyPreActivationUnit,
            dict(filters=32, strides=2, shortcut="projection", preactivation="shared"),
            16,
        ),
    ]
    + [
        (f"original-{type(merge).__name__}", units.OriginalUnit, dict(filters=16, merge=merge), 16)
        for merge in (
            kp.NoShortcut(),
            kp.ConstantScaling(0.5, 0.5),
            kp.ExclusiveGating(-6.0, weight_decay=1e-4),
            kp.ShortcutOnlyGating(0.0),
            kp.ShortcutDropout(0.5, seed=3),
        )
    ]
    + [
        (
            "preactivation-ExclusiveGating-stride2",
            units.PreActivationUnit,
            dict(filters=32, strides=2, shortcut="zero_pad", preactivation="shared", merge=kp.ExclusiveGating(-2.0)),
            16,
        ),
    ]
)
UNIT_IDS = [case[0] for case in UNIT_CASES]


def make_unit(cls, arguments, **overrides):
    return cls(**arguments, **overrides)


@pytest.mark.parametrize("case_id, cls, arguments, channels", UNIT_CASES, ids=UNIT_IDS)
def test_config_round_trip_and_serialization(case_id, cls, arguments, channels):
    unit = make_unit(cls, arguments)
    unit(random_images((2, 8, 8, channels)))
    config, rebuilt_config = config_round_trip(unit)
    assert json.dumps(config, sort_keys=True, default=str) == json.dumps(rebuilt_config, sort_keys=True, default=str)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(unit))
    assert type(restored) is cls
    assert restored.get_config() == config


@pytest.mark.parametrize("case_id, cls, arguments, channels", UNIT_CASES, ids=UNIT_IDS)
def test_output_shape_equals_compute_output_shape(case_id, cls, arguments, channels):
    unit = make_unit(cls, arguments)
    for shape in [(2, 8, 8, channels), (1, 7, 9, channels)]:
        outputs = unit(random_images(shape), training=True)
        assert tuple(outputs.shape) == unit.compute_output_shape(shape)
        assert np.all(np.isfinite(ops.convert_to_numpy(outputs)))


@pytest.mark.parametrize("case_id, cls, arguments, channels", UNIT_CASES, ids=UNIT_IDS)
def test_one_training_step_changes_every_weight(case_id, cls, arguments, channels):
    inputs = keras.Input((8, 8, channels))
    unit = make_unit(cls, arguments)
    x = keras.layers.GlobalAveragePooling2D()(unit(inputs))
    model = keras.Model(inputs, keras.layers.Dense(3)(x))
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = [np.array(variable) for variable in unit.weights]
    loss = model.train_on_batch(random_images((4, 8, 8, channels)), np.array([0, 1, 2, 0]))
    assert np.isfinite(loss)
    # Every weight moves: the trainable ones by SGD, BatchNorm's moving statistics
    # because the step ran the unit in training mode.
    unchanged = [variable.path for variable, old in zip(unit.weights, before) if np.array_equal(old, variable)]
    assert unchanged == []


@pytest.mark.parametrize("case_id, cls, arguments, channels", UNIT_CASES, ids=UNIT_IDS)
def test_mixed_bfloat16(case_id, cls, arguments, channels):
    unit = make_unit(cls, arguments, dtype="mixed_bfloat16")
    outputs = unit(random_images((2, 8, 8, channels)), training=True)
    assert keras.backend.standardize_dtype(outputs.dtype) == "bfloat16"
    assert {variable.dtype for variable in unit.weights} == {"float32"}
    assert {layer.dtype_policy.name for layer in unit._flatten_layers(include_self=False)} == {"mixed_bfloat16"}


def zero_last_convolution(unit):
    kernel = unit.convs[-1].kernel
    kernel.assign(ops.zeros(kernel.shape))


@pytest.mark.parametrize("form", list(units.FORMS))
@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
def test_preactivation_unit_with_zeroed_branch_is_exactly_the_identity(form, training):
    """Eqn. 4-5 of the paper: with F = 0 the full pre-activation unit passes x_l on
    unchanged and its Jacobian is the identity, in both modes of BatchNorm."""
    unit = units.PreActivationUnit(4 if form == "bottleneck" else 16, form=form)
    x = random_images((1, 4, 4, 16))
    unit(x)
    zero_last_convolution(unit)
    np.testing.assert_array_equal(ops.convert_to_numpy(unit(x, training=training)), x)
    np.testing.assert_array_equal(jacobian(unit, x, training), np.eye(x.size))


@pytest.mark.parametrize("training", [True, False], ids=["training", "inference"])
def test_original_unit_with_zeroed_branch_is_not_the_identity(training):
    """The original unit's ReLU after the addition cuts negative signals and their gradient."""
    unit = units.OriginalUnit(16)
    x = random_images((1, 4, 4, 16))
    unit(x)
    zero_last_convolution(unit)
    np.testing.assert_array_equal(ops.convert_to_numpy(unit(x, training=training)), np.maximum(x, 0))
    np.testing.assert_array_equal(jacobian(unit, x, training), np.diag((x.reshape(-1) > 0).astype("float32")))


def relu(x):
    return ops.relu(x)


# Each unit's figure, written out with the unit's own layers (c: convolutions, n:
# BatchNorms, h: shortcut): the unit must compute exactly this.
FIGURES = {
    "original": lambda u, x: relu(x + u.norms[1](u.convs[1](relu(u.norms[0](u.convs[0](x)))))),
    "bn_after_addition": lambda u, x: relu(u.norms[1](x + u.convs[1](relu(u.norms[0](u.convs[0](x)))))),
    "relu_before_addition": lambda u, x: x + relu(u.norms[1](u.convs[1](relu(u.norms[0](u.convs[0](x)))))),
    "relu_only_preactivation": lambda u, x: x + u.norms[1](u.convs[1](relu(u.norms[0](u.convs[0](relu(x)))))),
    "preactivation": lambda u, x: x + u.convs[1](relu(u.norms[1](u.convs[0](relu(u.norms[0](x)))))),
}


@pytest.mark.parametrize("name", list(FIGURES))
def test_unit_computes_its_figure(name):
    unit = units.UNITS[name](16)
    x = random_images((2, 6, 6, 16))
    unit(x)
    figure = FIGURES[name](unit, ops.convert_to_tensor(x))
    np.testing.assert_allclose(
        ops.convert_to_numpy(unit(x, training=False)), ops.convert_to_numpy(figure), rtol=1e-6, atol=1e-6
    )


def test_shared_preactivation_feeds_both_paths():
    """First unit of a stage: BN-ReLU once, then the zero-padded shortcut and the branch."""
    unit = units.PreActivationUnit(32, strides=2, shortcut="zero_pad", preactivation="shared")
    x = random_images((2, 8, 8, 16))
    unit(x)
    activated = relu(unit.norms[0](x))
    branch = unit.convs[1](relu(unit.norms[1](unit.convs[0](activated))))
    shortcut = np.pad(ops.convert_to_numpy(activated)[:, ::2, ::2, :], [(0, 0), (0, 0), (0, 0), (0, 16)])
    np.testing.assert_allclose(
        ops.convert_to_numpy(unit(x, training=False)), shortcut + ops.convert_to_numpy(branch), rtol=1e-6, atol=1e-6
    )


def test_no_preactivation_reads_the_input_in_both_paths():
    unit = units.PreActivationUnit(16, form="bottleneck", shortcut="projection", preactivation="none")
    x = random_images((2, 8, 8, 16))
    unit(x)
    assert [norm.name for norm in unit.norms] == ["bn2", "bn3"]
    branch = unit.convs[2](relu(unit.norms[1](unit.convs[1](relu(unit.norms[0](unit.convs[0](x)))))))
    expected = ops.convert_to_numpy(unit.shortcut_path.conv(x)) + ops.convert_to_numpy(branch)
    np.testing.assert_allclose(ops.convert_to_numpy(unit(x, training=False)), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stride_on, strided_conv", [("first", "conv1"), ("3x3", "conv2")])
def test_bottleneck_stride_position(stride_on, strided_conv):
    unit = units.PreActivationUnit(8, form="bottleneck", strides=2, shortcut="projection", stride_on=stride_on)
    assert {conv.name: conv.strides[0] for conv in unit.convs} == {
        name: 2 if name == strided_conv else 1 for name in ("conv1", "conv2", "conv3")
    }


def test_strided_convolution_is_centred_on_the_pixels_the_shortcut_keeps():
    """Torch/Caffe pad a strided 3x3 convolution by 1 on every side; Keras' "same" would
    pad only the bottom and right and sample the odd pixels."""
    conv = kp.base_layers.SymmetricConv2D(1, 3, strides=2)
    x = random_images((1, 8, 8, 1))
    conv.build(x.shape)
    kernel = np.zeros((3, 3, 1, 1), "float32")
    kernel[1, 1] = 1.0
    conv.kernel.assign(kernel)
    np.testing.assert_array_equal(ops.convert_to_numpy(conv(x)), x[:, ::2, ::2, :])


def test_projection_shortcut_normalization_follows_the_unit():
    pre = units.PreActivationUnit(32, strides=2, shortcut="projection")
    original = units.OriginalUnit(32, strides=2, shortcut="projection")
    assert pre.shortcut_path.norm is None
    assert original.shortcut_path.norm is not None


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(filters=0), "filters must be a positive integer. Received: filters=0"),
        (dict(filters=16, form="wide"), "form must be one of ['basic', 'bottleneck', 'single']. Received: form='wide'"),
        (dict(filters=16, strides=3), "strides must be one of [1, 2]. Received: strides=3"),
        (dict(filters=16, shortcut="conv"), "Received: shortcut='conv'"),
        (dict(filters=16, stride_on="last"), "Received: stride_on='last'"),
        (dict(filters=16, weight_decay=-1), "weight_decay must be a number >= 0"),
        (
            dict(filters=16, merge="gating"),
            "merge must be a layer from keras_preact.merges or None. Received: merge='gating'",
        ),
        (dict(filters=16, preactivation="both"), "Received: preactivation='both'"),
    ],
)
def test_invalid_arguments_name_the_received_value(arguments, message):
    with pytest.raises(ValueError) as error:
        units.PreActivationUnit(**arguments)
    assert message in str(error.value)


def test_identity_shortcut_refuses_a_shape_change():
    with pytest.raises(ValueError, match="Received: 16 input channels, output_channels=32, strides=1"):
        units.PreActivationUnit(32)(random_images((1, 8, 8, 16)))
