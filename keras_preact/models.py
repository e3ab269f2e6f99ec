"""Model functions: the paper's networks with the Keras Applications signature.

`ResNet` builds any `Architecture`; each named function (`ResNet110`, `ResNet1001`,
`ResNet200`, ...) is one line over the table in `keras_preact.architectures`, and
`MODELS` maps every registered name to its builder.
"""

# Annotations stay text: the module imported by Keras' own import (the layers' registration)
# must not evaluate another module's classes while that module is half-imported.
from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable

import keras

from keras_preact import architectures, base_layers, defaults, layouts, merges, pretrained, stacked, units

POOLINGS = (None, "avg", "max")
# `include_preprocessing`'s per-channel (mean, std) on the 0-255 scale, by stem: CIFAR-10's
# for the CIFAR networks, ImageNet's for the ImageNet networks; shipped weights take their
# data set's (`pretrained.DATASETS`).
PREPROCESSING = {
    "cifar": (defaults.CIFAR10_MEAN, defaults.CIFAR10_STD),
    "imagenet": (defaults.IMAGENET_MEAN, defaults.IMAGENET_STD),
}


def ResNet(
    architecture: str | architectures.Architecture,
    unit: str = "preactivation",
    shortcut: str = "identity",
    merge: merges.Merge | None = None,
    downsample_shortcut: str | None = None,
    stride_on: str | None = None,
    weight_decay: float = 0.0,
    rematerialize: bool = False,
    scan_units: bool | None = None,
    include_top: bool = True,
    include_preprocessing: bool = False,
    weights: str | os.PathLike | None = None,
    input_tensor: keras.KerasTensor | None = None,
    input_shape: tuple[int | None, ...] | None = None,
    pooling: str | None = None,
    classes: int | None = None,
    classifier_activation: str | Callable | None = "softmax",
    name: str | None = None,
) -> keras.Model:
    """Builds a residual network of the paper.

    Args:
        architecture: an `Architecture`, or the name of one in
            `keras_preact.architectures.ARCHITECTURES` ("resnet110", ...).
        unit: the residual unit, a key of `keras_preact.units.UNITS`:
            "preactivation" (Fig. 4(e), the paper's proposal), "original" (Fig. 4(a)),
            "bn_after_addition" (4(b)), "relu_before_addition" (4(c)) or
            "relu_only_preactivation" (4(d)).
        shortcut: the shortcut of units that keep their shape: "identity", or
            "projection" for a 1x1 convolution on every unit (Fig. 2(e)).
        merge: a layer from `keras_preact.merges` that combines shortcut and residual
            branch in every unit (Fig. 2: `ConstantScaling`, `ExclusiveGating`,
            `ShortcutOnlyGating`, `ShortcutDropout`, `NoShortcut`); each unit uses a
            copy of it, whose weight decay is the network's. `None` for addition.
        downsample_shortcut: the shortcut of units that change shape, "zero_pad" or
            "projection"; `None` for "projection" where `shortcut` is, and otherwise
            the architecture's (zero padding for the basic CIFAR nets, projection
            for the others).
        stride_on: "first" or "3x3", the strided convolution of bottleneck units;
            `None` for the architecture's ("first" on CIFAR, "3x3" on ImageNet).
        weight_decay: coupled weight decay on every weight, applied as an L2
            regularizer of half that value (see `keras_preact.defaults.weight_regularizer`).
            0 (the default) adds no regularizer, as Keras Applications' model functions;
            the paper's 1e-4 (Sec. 4, `keras_preact.defaults.WEIGHT_DECAY`) is what
            `keras-preact train`'s recipes set.
        rematerialize: recompute every unit's branches in the backward pass instead
            of keeping their activations (`keras.remat`): less activation memory for
            about one more forward pass, the same gradients and BatchNorm statistics.
        scan_units: hold units 2 to the last of each stage as one
            `keras_preact.stacked.StackedUnits` layer, run as a loop over their
            stacked weights: the same network, traced once per stage instead of once
            per unit, so that deep networks build, compile, export and load in
            seconds. Its weights are named `stage1_units2to111/conv1_kernel`, ...;
            `copy_weights` converts between the two layouts, and a weights file
            saved from either loads into either. `None` (the default): loops where
            a stage has at least `keras_preact.defaults.LOOPED_STAGE_UNITS` units
            (ResNet-1001 and ResNet-1202) and the merge can be stacked (not
            `ShortcutDropout`), separate units otherwise.
        include_top: whether to end with the fully connected classifier.
        include_preprocessing: take 0-255 pixels and normalise them inside the model
            (`keras_preact.preprocess_input` as a first layer: the per-channel mean and
            std of the shipped weights' data set, else CIFAR-10's for CIFAR networks and
            ImageNet's for ImageNet networks), as Keras Applications' ConvNeXt and
            EfficientNetV2 do. Needs 3 channels.
        weights: `None` (random initialisation), the path of a weights file
            (`.weights.h5`) saved from the same network, or "cifar10" or "cifar100": the
            weights keras-preact trained on that data set for this network
            (`keras_preact.pretrained`), checked against their SHA-256. With
            `include_top=False` every weight but the classifier's is loaded.
        input_tensor: optional Keras tensor (output of `keras.Input()`) to use as input.
        input_shape: optional `(height, width, channels)`; the architecture's
            (32, 32, 3) or (224, 224, 3) by default. Height and width may be `None`.
        pooling: without the top, `None` (the last feature map), "avg" or "max".
        classes: number of classes; `None` for the shipped weights' (10 or 100), else the
            architecture's (10 or 1000).
        classifier_activation: activation of the classifier, `None` for logits.
        name: the model's name; by default the architecture's name, followed by the
            unit's where it is not "preactivation".

    Returns:
        A `keras.Model`.

    Raises:
        ValueError: for an unknown architecture, unit, shortcut or pooling, a bad
            input shape, `classes` < 1, `weights` that is neither `None`, an existing
            file nor a data set, "cifar10" weights asked of a network that has none
            (the message lists those that have), or a weights file that is corrupt
            or altered (a SHA-256 that differs from the registry's) or does not fit.

    Example:

    >>> model = ResNet("resnet110", unit="original",
    ...                merge=keras_preact.merges.ExclusiveGating(gate_bias=-6))
    """
    architecture_name = architecture if isinstance(architecture, str) else None
    if architecture_name is not None:
        units.check_choice("architecture", architecture_name, architectures.ARCHITECTURES)
        architecture = architectures.ARCHITECTURES[architecture_name]
    elif not isinstance(architecture, architectures.Architecture):
        raise ValueError(
            "architecture must be an Architecture or one of "
            f"{sorted(architectures.ARCHITECTURES)}. Received: architecture={architecture!r}"
        )
    units.check_choice("unit", unit, units.UNITS)
    units.check_choice("shortcut", shortcut, ("identity", "projection"))
    units.check_choice("pooling", pooling, POOLINGS)
    if not isinstance(rematerialize, bool):
        raise ValueError(f"rematerialize must be True or False. Received: rematerialize={rematerialize!r}")
    if scan_units is not None and not isinstance(scan_units, bool):
        raise ValueError(
            f"scan_units must be True, False or None (loops for the deepest networks). "
            f"Received: scan_units={scan_units!r}"
        )
    if merge is not None and not isinstance(merge, merges.Merge):
        raise ValueError(f"merge must be a layer from keras_preact.merges or None. Received: merge={merge!r}")
    if scan_units is None:
        scan_units = loops_by_default(architecture, merge)
    weight_decay = defaults.validate_weight_decay(weight_decay)
    if classes is None:
        shipped_classes = pretrained.DATASETS.get(weights, {}).get("classes") if isinstance(weights, str) else None
        classes = len(shipped_classes) if shipped_classes else architecture.default_classes
    if include_top and (not defaults.is_integer(classes) or classes < 1):
        raise ValueError(f"classes must be a positive integer. Received: classes={classes!r}")
    classes = int(classes) if include_top else classes
    _check_weights(weights)
    if not isinstance(include_preprocessing, bool):
        raise ValueError(
            f"include_preprocessing must be True or False. Received: include_preprocessing={include_preprocessing!r}"
        )
    inputs = _inputs(architecture, input_tensor, input_shape)
    if include_preprocessing and inputs.shape[-1] != 3:
        raise ValueError(
            "include_preprocessing normalises RGB images and needs 3 channels. Received: "
            f"input_shape={tuple(inputs.shape[1:])}"
        )
    unit_class = units.UNITS[unit]
    if downsample_shortcut is None:
        downsample_shortcut = "projection" if shortcut == "projection" else architecture.downsample_shortcut
    stride_on = stride_on or architecture.stride_on
    default_name = (architecture_name or f"resnet{architecture.depth}") + (
        "" if unit == "preactivation" else f"_{unit}"
    )
    shipped = None
    if isinstance(weights, str) and weights in pretrained.DATASETS:
        # Trained networks have the architecture's own shortcuts, strides and merge.
        own = dict(
            shortcut="identity",
            merge=None,
            downsample_shortcut=architecture.downsample_shortcut,
            stride_on=architecture.stride_on,
        )
        chosen = dict(shortcut=shortcut, merge=merge, downsample_shortcut=downsample_shortcut, stride_on=stride_on)
        shipped = pretrained.find(
            weights,
            default_name if architecture_name else None,
            classes,
            inputs.shape[1:],
            include_top,
            {option: value for option, value in chosen.items() if value != own[option]},
        )

    x = inputs
    if include_preprocessing:
        statistics = (
            (pretrained.DATASETS[weights]["mean"], pretrained.DATASETS[weights]["std"])
            if shipped is not None
            else PREPROCESSING[architecture.stem]
        )
        x = pretrained.normalization(*statistics, name="preprocessing")(x)
    x = STEMS[architecture.stem](x, weight_decay)
    for stage, (unit_count, width) in enumerate(zip(architecture.units_per_stage, architecture.widths), start=1):
        for index in range(1, unit_count + 1):
            strides = 2 if index == 1 and stage > 1 else 1
            output_channels = units.FORMS[architecture.form].widths(width)[-1]
            changes_shape = strides != 1 or x.shape[-1] != output_channels
            options = {}
            if issubclass(unit_class, units.PreActivatedUnit):
                options["preactivation"] = _preactivation(stage, index)
            stack = scan_units and index == 2
            residual_unit = unit_class(
                width,
                form=architecture.form,
                strides=strides,
                shortcut=downsample_shortcut if changes_shape else shortcut,
                merge=merge,
                stride_on=stride_on,
                weight_decay=weight_decay,
                rematerialize=rematerialize and not stack,
                name=f"stage{stage}_unit{index}",
                **options,
            )
            if stack:
                # Units 2 to the last are the same function of different weights.
                x = stacked.StackedUnits(
                    residual_unit,
                    unit_count - 1,
                    rematerialize=rematerialize,
                    name=layouts.stacked_name(stage, unit_count),
                )(x)
                break
            x = residual_unit(x)
    for layer in unit_class.final_activation:
        x = FINAL_ACTIVATIONS[layer](weight_decay)(x)

    if include_top:
        x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
        regularizer = defaults.weight_regularizer(weight_decay)
        x = keras.layers.Dense(
            classes,
            activation=classifier_activation,
            kernel_regularizer=regularizer,
            bias_regularizer=regularizer,
            name="predictions",
        )(x)
    elif pooling == "avg":
        x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
    elif pooling == "max":
        x = keras.layers.GlobalMaxPooling2D(name="max_pool")(x)

    model_inputs = keras.utils.get_source_inputs(input_tensor) if input_tensor is not None else inputs
    model = keras.Model(model_inputs, x, name=name or default_name)
    if shipped is not None:
        # The file holds the whole network, units separate: load it as such, copy what this model has.
        trained = ResNet(
            architecture,
            unit=unit,
            include_preprocessing=include_preprocessing,
            scan_units=False,
            classes=len(pretrained.DATASETS[weights]["classes"]),
            classifier_activation=classifier_activation,
        )
        layouts.load_weights_file(trained, pretrained.verified_file(shipped))
        layouts.copy_weights(trained, model)
    elif weights is not None:
        # The same network in the other layout, for a file saved from it.
        other_layout = functools.partial(
            ResNet,
            architecture,
            unit=unit,
            shortcut=shortcut,
            merge=merge,
            downsample_shortcut=downsample_shortcut,
            stride_on=stride_on,
            weight_decay=weight_decay,
            scan_units=not scan_units,
            include_top=include_top,
            include_preprocessing=include_preprocessing,
            input_shape=tuple(inputs.shape[1:]),
            pooling=pooling,
            classes=classes,
            classifier_activation=classifier_activation,
        )
        layouts.load_weights_file(model, weights, None if _has_unstackable_merge(merge) else other_layout)
    return model


def loops_by_default(architecture, merge=None):
    """`scan_units=None`'s choice: units as loops where a stage of `architecture` has at
    least `defaults.LOOPED_STAGE_UNITS` units and `merge` can be stacked."""
    return max(architecture.units_per_stage) >= defaults.LOOPED_STAGE_UNITS and not _has_unstackable_merge(merge)


def _has_unstackable_merge(merge):
    """A merge with random state of its own per unit, which `StackedUnits` cannot stack."""
    return isinstance(merge, merges.ShortcutDropout)


def _preactivation(stage, index):
    """The official code's pre-activation of a unit: see `units.PreActivatedUnit`."""
    if index > 1:
        return "residual"
    return "none" if stage == 1 else "shared"


def _check_weights(weights):
    if weights is None or (isinstance(weights, str) and weights in pretrained.DATASETS):
        return
    if isinstance(weights, (str, os.PathLike)) and os.fspath(weights).endswith(".h5") and not os.path.isfile(weights):
        raise ValueError(
            f"The weights file {os.fspath(weights)} is missing: give the path of a weights file (.weights.h5) saved "
            f"from the same network, or one of {sorted(pretrained.DATASETS)} for keras-preact's trained weights. "
            f"Received: weights={weights!r}"
        )
    if not (isinstance(weights, (str, os.PathLike)) and os.path.isfile(weights)):
        raise ValueError(
            "weights must be None (random initialisation), the path of an existing weights file "
            f"(.weights.h5) saved from the same network, or one of {sorted(pretrained.DATASETS)} for "
            f"keras-preact's trained weights. Received: weights={weights!r}"
        )


def _inputs(architecture, input_tensor, input_shape):
    """The model's input layer, with the input shape validated."""
    if input_tensor is not None:
        if not keras.backend.is_keras_tensor(input_tensor):
            raise ValueError(
                "input_tensor must be a Keras tensor, e.g. the output of keras.Input(). "
                f"Received: input_tensor={input_tensor!r}"
            )
        tensor_shape = tuple(input_tensor.shape[1:])
        if input_shape is not None and tuple(input_shape) != tensor_shape:
            raise ValueError(
                f"input_shape must match input_tensor's shape {tensor_shape}. Received: input_shape={input_shape!r}"
            )
        input_shape = tensor_shape
    if input_shape is None:
        input_shape = architecture.default_input_shape
    _check_input_shape(architecture, input_shape)
    if input_tensor is not None:
        return input_tensor
    return keras.Input(shape=tuple(None if size is None else int(size) for size in input_shape), name="images")


# The smallest height and width a network takes: its total stride (CIFAR 4, ImageNet 32),
# so that the last stage sees at least one pixel.
MINIMUM_INPUT_SIZE = {"cifar": 4, "imagenet": 32}


def _check_input_shape(architecture, input_shape):
    minimum = MINIMUM_INPUT_SIZE[architecture.stem]
    if keras.config.image_data_format() != "channels_last":
        raise ValueError(
            "keras-preact networks take channels-last images; set "
            "keras.config.set_image_data_format('channels_last'). Received: "
            f"image_data_format={keras.config.image_data_format()!r}"
        )
    valid = (
        isinstance(input_shape, (tuple, list))
        and len(input_shape) == 3
        and all(size is None or (defaults.is_integer(size) and size >= minimum) for size in input_shape[:2])
        and defaults.is_integer(input_shape[2])
        and input_shape[2] >= 1
    )
    if not valid:
        raise ValueError(
            "input_shape must be (height, width, channels) with height and width None or "
            f">= {minimum} and a known number of channels, e.g. {architecture.default_input_shape}. "
            f"Received: input_shape={input_shape!r}"
        )


def _cifar_stem(inputs, weight_decay):
    """One 3x3 convolution with 16 filters, BN-ReLU (the paper's conv1)."""
    x = base_layers.SymmetricConv2D(16, 3, 1, weight_decay, name="stem_conv")(inputs)
    x = base_layers.batch_norm(weight_decay, "stem_bn")(x)
    return keras.layers.ReLU(name="stem_relu")(x)


def _imagenet_stem(inputs, weight_decay):
    """7x7/2 convolution with 64 filters, BN-ReLU, 3x3/2 max pooling padded by 1."""
    x = base_layers.SymmetricConv2D(64, 7, 2, weight_decay, name="stem_conv")(inputs)
    x = base_layers.batch_norm(weight_decay, "stem_bn")(x)
    x = keras.layers.ReLU(name="stem_relu")(x)
    x = keras.layers.ZeroPadding2D(1, name="stem_pool_pad")(x)
    return keras.layers.MaxPooling2D(3, strides=2, name="stem_pool")(x)


STEMS = {"cifar": _cifar_stem, "imagenet": _imagenet_stem}
FINAL_ACTIVATIONS = {
    "batch_norm": lambda weight_decay: base_layers.batch_norm(weight_decay, "final_bn"),
    "relu": lambda weight_decay: keras.layers.ReLU(name="final_relu"),
}


def CifarResNet(depth: int, form: str = "basic", **kwargs) -> keras.Model:
    """A CIFAR network of any depth: 6n+2 for "basic", 9n+2 for "bottleneck" and 3n+2
    for "single" units. Takes the `ResNet` arguments.

    >>> model = CifarResNet(650, form="bottleneck")   # 72 units per stage
    """
    kwargs.setdefault("name", f"resnet{depth}" + ("" if form == "basic" else f"_{form}"))
    return ResNet(architectures.cifar_depth(depth, form), **kwargs)


def _named(architecture_name, description):
    def builder(**kwargs):
        return ResNet(architecture_name, **kwargs)

    function_name = "ResNet" + architecture_name[len("resnet") :].replace("_1layer", "OneLayer")
    builder.__name__ = builder.__qualname__ = function_name
    builder.architecture_name = architecture_name
    signature = inspect.signature(ResNet)
    builder.__signature__ = signature.replace(parameters=list(signature.parameters.values())[1:])
    builder.__annotations__ = {name: kind for name, kind in ResNet.__annotations__.items() if name != "architecture"}
    builder.__doc__ = (
        f"{description}\n\nPre-activation units unless `unit=` says otherwise; takes the `ResNet` "
        f"arguments. Architecture: `ARCHITECTURES[{architecture_name!r}]`."
    )
    return builder


ResNet20 = _named("resnet20", "ResNet-20 for CIFAR: 3 basic units per stage ([1], Section 4.2).")
ResNet32 = _named("resnet32", "ResNet-32 for CIFAR: 5 basic units per stage ([1], Section 4.2).")
ResNet44 = _named("resnet44", "ResNet-44 for CIFAR: 7 basic units per stage ([1], Section 4.2).")
ResNet56 = _named("resnet56", "ResNet-56 for CIFAR: 9 basic units per stage ([1], Section 4.2).")
ResNet110 = _named("resnet110", "ResNet-110 for CIFAR: 18 basic units per stage (paper, Tables 1-3).")
ResNet110OneLayer = _named(
    "resnet110_1layer", 'ResNet-110 "(1layer skip)" for CIFAR: 36 single-convolution units per stage (Table 3).'
)
ResNet164 = _named("resnet164", "ResNet-164 for CIFAR: 18 bottleneck units per stage (paper, Tables 2-3).")
ResNet1001 = _named("resnet1001", "ResNet-1001 for CIFAR: 111 bottleneck units per stage (paper, Tables 3-4).")
ResNet1202 = _named("resnet1202", "ResNet-1202 for CIFAR: 200 basic units per stage ([1]; paper, Table 4).")
ResNet18 = _named("resnet18", "ResNet-18 for ImageNet: basic units, stages [2, 2, 2, 2] ([1], Table 1).")
ResNet34 = _named("resnet34", "ResNet-34 for ImageNet: basic units, stages [3, 4, 6, 3] ([1], Table 1).")
ResNet50 = _named("resnet50", "ResNet-50 for ImageNet: bottleneck units, stages [3, 4, 6, 3] ([1], Table 1).")
ResNet101 = _named("resnet101", "ResNet-101 for ImageNet: bottleneck units, stages [3, 4, 23, 3] ([1], Table 1).")
ResNet152 = _named("resnet152", "ResNet-152 for ImageNet: bottleneck units, stages [3, 8, 36, 3] (paper, Table 5).")
ResNet200 = _named("resnet200", "ResNet-200 for ImageNet: bottleneck units, stages [3, 24, 36, 3] (paper, Table 5).")

# Every registered network: "<architecture>" with pre-activation units, the paper's
# proposal, and "<architecture>_original" with the original units of [1].
NAMED_BUILDERS = (
    ResNet20,
    ResNet32,
    ResNet44,
    ResNet56,
    ResNet110,
    ResNet110OneLayer,
    ResNet164,
    ResNet1001,
    ResNet1202,
    ResNet18,
    ResNet34,
    ResNet50,
    ResNet101,
    ResNet152,
    ResNet200,
)
MODELS = {}
for _builder in NAMED_BUILDERS:
    MODELS[_builder.architecture_name] = _builder
    MODELS[f"{_builder.architecture_name}{architectures.ORIGINAL_SUFFIX}"] = functools.partial(
        _builder, unit="original"
    )


def list_models() -> list[str]:
    """The names of every registered network, for `get_model`."""
    return sorted(MODELS)


def get_model(name: str, **kwargs) -> keras.Model:
    """Builds the registered network `name` (see `list_models()`) with `ResNet` arguments.

    Raises:
        ValueError: if `name` is not registered.
    """
    if name not in MODELS:
        raise ValueError(f"Unknown model. Choose one of {list_models()}. Received: name={name!r}")
    return MODELS[name](**kwargs)
