"""Every registered network: parameters, gradients, save/load; the builders' arguments."""

import os

import keras
import numpy as np
import pytest

import keras_preact as kp
from keras_preact import architectures, units
from tests.conftest import ROOT, output_gradients, random_images

# (all parameters, trainable parameters). The original ImageNet nets equal torchvision's
# ResNet-18/34/50/101/152 to the parameter; the paper (Table 4) rounds to 1.7M
# (ResNet-110, ResNet-164), 10.2M (ResNet-1001) and 19.4M (ResNet-1202).
PARAMETER_COUNTS = {
    "resnet20": (271098, 269722),
    "resnet20_original": (271098, 269722),
    "resnet32": (466426, 464154),
    "resnet32_original": (466426, 464154),
    "resnet44": (661754, 658586),
    "resnet44_original": (661754, 658586),
    "resnet56": (857082, 853018),
    "resnet56_original": (857082, 853018),
    "resnet110": (1736058, 1727962),
    "resnet110_original": (1736058, 1727962),
    "resnet110_1layer": (1736058, 1727962),
    "resnet110_1layer_original": (1736058, 1727962),
    "resnet164": (1727482, 1703258),
    "resnet164_original": (1729274, 1704154),
    "resnet1001": (10476922, 10327706),
    "resnet1001_original": (10478714, 10328602),
    "resnet1202": (19510906, 19421274),
    "resnet1202_original": (19510906, 19421274),
    "resnet18": (11695528, 11687720),
    "resnet18_original": (11699112, 11689512),
    "resnet34": (21811112, 21795880),
    "resnet34_original": (21814696, 21797672),
    "resnet50": (25594792, 25549352),
    "resnet50_original": (25610152, 25557032),
    "resnet101": (44639144, 44541480),
    "resnet101_original": (44654504, 44549160),
    "resnet152": (60328872, 60185128),
    "resnet152_original": (60344232, 60192808),
    "resnet200": (64834472, 64666152),
    "resnet200_original": (64849832, 64673832),
}
LARGE = {"resnet101", "resnet152", "resnet200", "resnet1001", "resnet1202"}


def architecture_of(name):
    return architectures.ARCHITECTURES[name.removesuffix("_original")]


def test_every_registered_model_has_a_pinned_parameter_count():
    assert sorted(PARAMETER_COUNTS) == kp.list_models()


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(name, marks=[pytest.mark.large] if name.removesuffix("_original") in LARGE else [])
        for name in sorted(PARAMETER_COUNTS)
    ],
)
def registered(request):
    """(name, model, inputs), built once per module; ImageNet nets at 64x64 to save time."""
    name = request.param
    input_shape = (32, 32, 3) if architecture_of(name).stem == "cifar" else (64, 64, 3)
    return name, kp.get_model(name, input_shape=input_shape), random_images((2,) + input_shape)


def trainable_count(model):
    return sum(int(np.prod(variable.shape)) for variable in model.trainable_variables)


def test_parameter_count(registered):
    name, model, _ = registered
    assert (model.count_params(), trainable_count(model)) == PARAMETER_COUNTS[name]


def test_forward_is_finite_and_every_weight_gets_a_gradient(registered):
    _, model, inputs = registered
    outputs = keras.ops.convert_to_numpy(model(inputs, training=True))
    assert outputs.shape == (2, architecture_of(registered[0]).default_classes)
    assert np.all(np.isfinite(outputs))
    gradients = output_gradients(model, inputs)
    without_gradient = [
        variable.path
        for variable, gradient in zip(model.trainable_variables, gradients)
        if gradient is None or not np.any(gradient) or not np.all(np.isfinite(gradient))
    ]
    assert without_gradient == []


def test_keras_save_and_load_give_identical_outputs(registered, tmp_path):
    _, model, inputs = registered
    path = tmp_path / "model.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    assert [layer.name for layer in restored.layers] == [layer.name for layer in model.layers]
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(restored(inputs, training=False)),
        keras.ops.convert_to_numpy(model(inputs, training=False)),
    )


def preactivation_cifar_parameters(architecture, classes=10):
    """Trainable parameters of a pre-activation CIFAR net, counted by hand.

    Per unit: its convolutions (k*k*in*out), a 1x1 projection where a bottleneck unit
    changes shape, and BatchNorm's gamma and beta before each convolution, except
    before the first convolution of the network's first unit (the stem's BN-ReLU
    serves it). Plus the stem (3x3x3x16 convolution, BN), the final BN and the
    classifier.
    """
    form = units.FORMS[architecture.form]
    total = 3 * 3 * 3 * 16 + 2 * 16
    channels = 16
    for stage, (count, width) in enumerate(zip(architecture.units_per_stage, architecture.widths), start=1):
        for index in range(1, count + 1):
            inputs = channels
            for kernel_size, output in zip(form.kernel_sizes, form.widths(width)):
                total += kernel_size * kernel_size * inputs * output
                inputs = output
            total += 2 * channels * (0 if stage == index == 1 else 1) + 2 * sum(form.widths(width)[:-1])
            if architecture.downsample_shortcut == "projection" and index == 1:
                total += channels * form.widths(width)[-1]
            channels = form.widths(width)[-1]
    return total + 2 * channels + channels * classes + classes


@pytest.mark.parametrize("name", ["resnet20", "resnet110", "resnet110_1layer", "resnet164", "resnet1001"])
def test_parameter_count_matches_a_count_by_hand(name):
    expected = preactivation_cifar_parameters(architectures.ARCHITECTURES[name])
    assert PARAMETER_COUNTS[name][1] == expected


def layer_map(model):
    return {layer.name: layer for layer in model.layers}


def test_appendix_rules_for_the_first_and_last_units():
    """First unit: the stem's activation feeds both paths; first unit of a later stage:
    one BN-ReLU before the split; last unit: an extra BN-ReLU after its addition."""
    layers = layer_map(kp.ResNet164())
    assert layers["stage1_unit1"].preactivation == "none"
    assert layers["stage2_unit1"].preactivation == "shared"
    assert layers["stage3_unit1"].preactivation == "shared"
    assert {layers[f"stage{s}_unit{u}"].preactivation for s in (1, 2, 3) for u in range(2, 19)} == {"residual"}
    assert [layer.name for layer in kp.ResNet164().layers[-4:]] == ["final_bn", "final_relu", "avg_pool", "predictions"]
    assert "final_bn" not in layer_map(kp.ResNet164(unit="original"))


def test_cifar_stride_and_shortcut_placement():
    resnet164, resnet110 = layer_map(kp.ResNet164()), layer_map(kp.ResNet110())
    assert resnet164["stage2_unit1"].convs[0].strides == (2, 2)
    assert resnet164["stage1_unit1"].shortcut == "projection"
    assert resnet164["stage1_unit1"].strides == 1
    assert resnet110["stage2_unit1"].shortcut == "zero_pad"
    assert resnet110["stage1_unit1"].shortcut == "identity"
    assert [layer.output.shape[1] for name, layer in resnet110.items() if name.endswith("unit18")] == [32, 16, 8]


def test_imagenet_bottleneck_strides_its_3x3_convolution():
    layers = layer_map(kp.ResNet50(input_shape=(64, 64, 3)))
    assert [conv.strides[0] for conv in layers["stage3_unit1"].convs] == [1, 2, 1]
    assert layers["stage1_unit1"].preactivation == "none"
    assert layers["stem_pool"].output.shape[1:3] == (16, 16)


@pytest.mark.parametrize("unit", list(units.UNITS))
def test_every_unit_builds_a_network(unit):
    model = kp.ResNet20(unit=unit)
    assert {type(layer) for layer in model.layers if layer.name.startswith("stage")} == {units.UNITS[unit]}
    assert np.all(np.isfinite(keras.ops.convert_to_numpy(model(random_images((2, 32, 32, 3)), training=True))))


@pytest.mark.parametrize(
    "merge",
    [
        kp.NoShortcut(),
        kp.ConstantScaling(0.5, 0.5),
        kp.ExclusiveGating(-6.0),
        kp.ShortcutOnlyGating(0.0),
        kp.ShortcutDropout(0.5),
    ],
    ids=lambda merge: type(merge).__name__,
)
def test_every_merge_goes_into_every_unit_with_the_network_weight_decay(merge):
    model = kp.ResNet20(unit="original", merge=merge, weight_decay=2e-4)
    merges_used = [layer.merge for layer in model.layers if layer.name.startswith("stage")]
    assert len(merges_used) == 9 and len({id(m) for m in merges_used}) == 9
    assert {type(m) for m in merges_used} == {type(merge)}
    assert {m.get_config().get("weight_decay", 2e-4) for m in merges_used} == {2e-4}


def test_projection_on_every_unit_fig_2e():
    layers = layer_map(kp.ResNet110(unit="original", shortcut="projection"))
    assert {layers[f"stage{s}_unit{u}"].shortcut for s in (1, 2, 3) for u in range(1, 19)} == {"projection"}


@pytest.mark.parametrize("depth, form, units_per_stage", [(650, "bottleneck", 72), (26, "basic", 4), (29, "single", 9)])
def test_cifar_resnet_of_any_depth(depth, form, units_per_stage):
    model = kp.CifarResNet(depth, form=form)
    assert sum(layer.name.startswith("stage1_") for layer in model.layers) == units_per_stage


def test_keras_applications_signature():
    features = kp.ResNet20(include_top=False)
    assert features.output.shape == (None, 8, 8, 64)
    assert kp.ResNet20(include_top=False, pooling="avg").output.shape == (None, 64)
    assert kp.ResNet20(include_top=False, pooling="max").output.shape == (None, 64)
    assert kp.ResNet20(classes=100).output.shape == (None, 100)
    assert kp.ResNet20(input_shape=(None, None, 1)).output.shape == (None, 10)
    logits = kp.ResNet20(classifier_activation=None)(random_images((2, 32, 32, 3)))
    assert not np.allclose(keras.ops.convert_to_numpy(logits).sum(axis=1), 1.0)
    images = keras.Input((40, 40, 3))
    model = kp.ResNet20(input_tensor=images, name="custom")
    assert model.name == "custom" and model.inputs[0] is images
    assert kp.ResNet110(unit="original").name == "resnet110_original"


def test_weights_from_a_file_reproduce_the_network(tmp_path):
    model = kp.ResNet20()
    path = str(tmp_path / "resnet20.weights.h5")
    model.save_weights(path)
    reloaded = kp.ResNet20(weights=path)
    inputs = random_images((2, 32, 32, 3))
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(reloaded(inputs)), keras.ops.convert_to_numpy(model(inputs))
    )


@pytest.mark.parametrize(
    "build, message",
    [
        (
            lambda: kp.CifarResNet(100, form="bottleneck"),
            "depth must be 9n+2 for bottleneck networks (11, 20, 29, ...). Received: depth=100",
        ),
        (lambda: kp.CifarResNet(21), "depth must be 6n+2 for basic networks (8, 14, 20, ...). Received: depth=21"),
        (lambda: kp.ResNet110(unit="postact"), "unit must be one of ['original', "),
        (lambda: kp.ResNet110(unit="postact"), "Received: unit='postact'"),
        (lambda: kp.ResNet20(classes=-3), "classes must be a positive integer. Received: classes=-3"),
        (lambda: kp.ResNet20(classes=True), "classes must be a positive integer. Received: classes=True"),
        (lambda: kp.ResNet20(classes=10.0), "classes must be a positive integer. Received: classes=10.0"),
        (lambda: kp.CifarResNet(True), "Received: depth=True"),
        (lambda: kp.ResNet20(weight_decay=float("nan")), "Received: weight_decay=nan"),
        (lambda: kp.ResNet20(input_shape=(32, 32)), "Received: input_shape=(32, 32)"),
        (lambda: kp.ResNet20(input_shape=(2, 2, 3)), "height and width None or >= 4"),
        (lambda: kp.ResNet50(input_shape=(16, 16, 3)), "Received: input_shape=(16, 16, 3)"),
        (lambda: kp.ResNet20(input_shape=(32, 32, None)), "known number of channels"),
        (
            lambda: kp.ResNet20(weights="nowhere/resnet20.weights.h5"),
            "The weights file nowhere/resnet20.weights.h5 is missing: give the path of a weights file",
        ),
        (
            lambda: kp.ResNet20(weights="imagenet"),
            "or one of ['cifar10', 'cifar100'] for keras-preact's trained weights. Received: weights='imagenet'",
        ),
        (lambda: kp.ResNet20(include_preprocessing=1), "Received: include_preprocessing=1"),
        (
            lambda: kp.ResNet20(include_preprocessing=True, input_shape=(32, 32, 1)),
            "needs 3 channels. Received: input_shape=(32, 32, 1)",
        ),
        (lambda: kp.ResNet20(pooling="mean"), "Received: pooling='mean'"),
        (lambda: kp.ResNet20(merge="gating"), "Received: merge='gating'"),
        (lambda: kp.ResNet20(shortcut="zero_pad"), "Received: shortcut='zero_pad'"),
        (lambda: kp.ResNet20(weight_decay="1e-4"), "Received: weight_decay='1e-4'"),
        (lambda: kp.ResNet("resnet9"), "Received: architecture='resnet9'"),
        (lambda: kp.get_model("resnet9000"), "Unknown model. Choose one of ['resnet1001', "),
        (lambda: kp.ResNet20(input_tensor=np.zeros((1, 32, 32, 3))), "input_tensor must be a Keras tensor"),
        (
            lambda: kp.ResNet20(input_tensor=keras.Input((32, 32, 3)), input_shape=(64, 64, 3)),
            "input_shape must match input_tensor's shape (32, 32, 3)",
        ),
    ],
)
def test_bad_arguments_raise_clear_errors(build, message):
    with pytest.raises(ValueError) as error:
        build()
    assert message in str(error.value)


def test_numpy_integers_are_accepted_and_serialize_as_ints():
    model = kp.CifarResNet(np.int64(20), classes=np.int32(7), input_shape=(np.int64(32), 32, np.int16(3)))
    assert model.input.shape == (None, 32, 32, 3) and model.output.shape == (None, 7)
    config = model.get_layer("predictions").get_config()
    assert type(config["units"]) is int
    assert kp.units.PreActivationUnit(np.int64(16)).get_config()["filters"] == 16
    keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(model))


def test_default_shapes_and_classes():
    assert kp.ResNet18().input.shape == (None, 224, 224, 3)
    assert kp.ResNet18().output.shape == (None, 1000)
    assert kp.ResNet20().input.shape == (None, 32, 32, 3)


@pytest.mark.large
def test_model_table_lists_every_architecture_with_its_parameters():
    from keras_preact.__main__ import model_table

    rows = model_table().splitlines()
    assert len(rows) == 2 + len(architectures.ARCHITECTURES)
    assert "| `resnet1001` | bottleneck | [111, 111, 111] | 1001 | 10.328M | 10.178M | 10.2M |" in rows


def test_networks_add_no_regularizer_unless_asked_as_keras_applications():
    """The first loss of a new network on ten classes is near ln 10 = 2.30 (the README's quick
    start): no L2 term unless `weight_decay` asks for the paper's."""
    folder = os.path.join(ROOT, "docs", "cifar10")
    names = sorted(name for name in os.listdir(folder) if name.endswith(".jpg"))  # one per class, in order
    images = np.stack([keras.utils.img_to_array(keras.utils.load_img(os.path.join(folder, name))) for name in names])
    labels = np.arange(10)
    model = kp.ResNet1001(classes=10, include_preprocessing=True)
    assert model.losses == []
    probabilities = model(images, training=True)  # as fit's first step: the batch's statistics
    loss = keras.losses.sparse_categorical_crossentropy(labels, probabilities)
    assert float(keras.ops.mean(loss)) == pytest.approx(np.log(10), abs=0.5)
    decayed = kp.ResNet20(weight_decay=1e-4)
    assert len(decayed.losses) == len(decayed.trainable_variables)
