"""Every network of the paper as one record of data.

A network is a stem, stages of residual units and a classifier. The records below give
what differs between networks; `keras_preact.models.ResNet` builds any of them. This table
imports without Keras (`keras_preact.units`, which needs it, is imported where a record's
depth is computed), so that a command line's network is checked, and named in its error,
before TensorFlow loads.
"""

import dataclasses

from keras_preact import defaults


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One network: its stem, its stages and how its units change shape.

    Attributes:
        stem: "cifar" (one 3x3 convolution, 16 filters) or "imagenet" (7x7/2
            convolution, 64 filters, 3x3/2 max pooling); both followed by BN-ReLU.
        form: the units' residual branch, a key of `keras_preact.units.FORMS`.
        units_per_stage: number of units in each stage.
        widths: width of each stage's residual branch (bottleneck units output 4x).
        downsample_shortcut: the shortcut of units that change shape: "zero_pad"
            (option A of [1], no parameters) or "projection" (option B).
        stride_on: which convolution of a bottleneck unit is strided.
        default_input_shape: the input the paper uses.
        default_classes: the classes of the paper's data set (CIFAR-10, ImageNet).
        paper_parameters: the parameter count in the paper (Table 4), in millions.
    """

    stem: str
    form: str
    units_per_stage: tuple
    widths: tuple
    downsample_shortcut: str
    stride_on: str
    default_input_shape: tuple
    default_classes: int
    paper_parameters: float = None

    @property
    def depth(self):
        """Weight layers on the longest path: stem + residual branches + classifier."""
        from keras_preact import units

        return 2 + len(units.FORMS[self.form].kernel_sizes) * sum(self.units_per_stage)


# Section 4 of [1] and the paper's appendix: three stages at 32, 16 and 8 pixels.
CIFAR_WIDTHS = (16, 32, 64)
# [1], Table 1: four stages at 56, 28, 14 and 7 pixels.
IMAGENET_WIDTHS = (64, 128, 256, 512)


def cifar(form, units_per_stage, paper_parameters=None):
    """A CIFAR network with `units_per_stage` units in each of its three stages.

    Basic nets shortcut with zero padding where they change shape, as the paper's
    ResNet-110 does ([1], option A); bottleneck nets project, as the official code of
    ResNet-164/1001 does, stride on the first 1x1 convolution.
    """
    return Architecture(
        stem="cifar",
        form=form,
        units_per_stage=(units_per_stage,) * 3,
        widths=CIFAR_WIDTHS,
        downsample_shortcut="projection" if form == "bottleneck" else "zero_pad",
        stride_on="first",
        default_input_shape=(32, 32, 3),
        default_classes=10,
        paper_parameters=paper_parameters,
    )


def imagenet(form, units_per_stage):
    """An ImageNet network; projections where units change shape, bottlenecks strided on
    their 3x3 convolution (fb.resnet.torch)."""
    return Architecture(
        stem="imagenet",
        form=form,
        units_per_stage=tuple(units_per_stage),
        widths=IMAGENET_WIDTHS,
        downsample_shortcut="projection",
        stride_on="3x3",
        default_input_shape=(224, 224, 3),
        default_classes=1000,
    )


# Units per stage follow from the depth: 6n+2 (basic), 9n+2 (bottleneck), 3n+2 (single).
ARCHITECTURES = {
    "resnet20": cifar("basic", 3),
    "resnet32": cifar("basic", 5),
    "resnet44": cifar("basic", 7),
    "resnet56": cifar("basic", 9),
    "resnet110": cifar("basic", 18, paper_parameters=1.7),
    # Table 3, "ResNet-110 (1layer skip)": 108 units of one 3x3 convolution each.
    "resnet110_1layer": cifar("single", 36),
    "resnet164": cifar("bottleneck", 18, paper_parameters=1.7),
    "resnet1001": cifar("bottleneck", 111, paper_parameters=10.2),
    "resnet1202": cifar("basic", 200, paper_parameters=19.4),
    "resnet18": imagenet("basic", (2, 2, 2, 2)),
    "resnet34": imagenet("basic", (3, 4, 6, 3)),
    "resnet50": imagenet("bottleneck", (3, 4, 6, 3)),
    "resnet101": imagenet("bottleneck", (3, 4, 23, 3)),
    "resnet152": imagenet("bottleneck", (3, 8, 36, 3)),
    # Section 5 of the paper: ResNet-152 with 16 more units on the 28x28 map.
    "resnet200": imagenet("bottleneck", (3, 24, 36, 3)),
}


# A registered network's name (`keras_preact.list_models()`): its architecture's, and with this
# suffix, the same network of the original units of [1].
ORIGINAL_SUFFIX = "_original"


def model_names():
    """Every registered network's name, as `keras_preact.list_models()` gives them, without Keras."""
    return sorted([*ARCHITECTURES, *(f"{name}{ORIGINAL_SUFFIX}" for name in ARCHITECTURES)])


def cifar_depth(depth, form="basic"):
    """The CIFAR architecture of any valid `depth` for `form`.

    Raises:
        ValueError: if `depth` is not layers * 3 * n + 2 for the form (6n+2 basic,
            9n+2 bottleneck, 3n+2 single) with n >= 1.
    """
    from keras_preact import units

    units.check_choice("form", form, units.FORMS)
    layers_per_unit = 3 * len(units.FORMS[form].kernel_sizes)
    examples = ", ".join(str(layers_per_unit * n + 2) for n in (1, 2, 3))
    if not defaults.is_integer(depth) or depth < layers_per_unit + 2 or (depth - 2) % layers_per_unit:
        raise ValueError(
            f"depth must be {layers_per_unit}n+2 for {form} networks ({examples}, ...). Received: depth={depth!r}"
        )
    return cifar(form, (int(depth) - 2) // layers_per_unit)
