"""Numbers shared by every network, each with its source.

Every constant used to build a unit or a network lives here once. The sources are the
paper's appendix (He et al., "Identity Mappings in Deep Residual Networks", ECCV 2016,
arXiv:1603.05027) and its official Torch code (github.com/KaimingHe/resnet-1k-layers,
which builds on facebook/fb.resnet.torch).
"""

import math
import numbers

# Torch's BatchNorm defaults, used by the official code: momentum 0.1 for the new batch,
# which is Keras' momentum 0.9 for the running average, and epsilon 1e-5.
BATCH_NORM_MOMENTUM = 0.9
BATCH_NORM_EPSILON = 1e-5

# Per-channel mean and standard deviation of CIFAR-10's training images on the 0-255
# scale, from the official Torch code (fb.resnet.torch datasets/cifar10.lua): the
# normalisation of training and of the shipped CIFAR-10 weights.
CIFAR10_MEAN = (125.3, 123.0, 113.9)
CIFAR10_STD = (63.0, 62.1, 66.7)
# CIFAR-100's, from the same code (fb.resnet.torch datasets/cifar100.lua): the normalisation of
# training on CIFAR-100 and of the shipped CIFAR-100 weights.
CIFAR100_MEAN = (129.3, 124.1, 112.4)
CIFAR100_STD = (68.2, 65.4, 70.4)
# ImageNet's, as fb.resnet.torch uses them: (0.485, 0.456, 0.406) x 255 and (0.229,
# 0.224, 0.225) x 255.
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)

# Paper appendix: "weight decay of 0.0001". Caffe and Torch add `decay * w` to the
# gradient before momentum (a coupled L2 term); see `weight_regularizer`.
WEIGHT_DECAY = 1e-4

# `scan_units=None` runs a stage's units as one loop (`keras_preact.StackedUnits`) where the
# stage has at least this many units: ResNet-1001 (111) and ResNet-1202 (200). Measured
# with `bench/first_step.py` (docs/benchmarks.md): there, separate units take minutes to
# the first training step and loops seconds, and loops are no slower per step; at 18
# units per stage (ResNet-110/164) loops reach the first step 25-40 s sooner but train
# ResNet-164 32 % slower per step at batch 128, and ImageNet's deepest stage has 36.
LOOPED_STAGE_UNITS = 100


def conv_initializer():
    """He (MSRA) initialisation as in the official code.

    `resnet-1k-layers` draws every convolution kernel from
    normal(0, sqrt(2 / (k * k * filters_out))): a fan-out, untruncated normal.
    """
    import keras  # here: the constants import without Keras (see keras_preact/__init__.py)

    return keras.initializers.VarianceScaling(scale=2.0, mode="fan_out", distribution="untruncated_normal")


def weight_regularizer(weight_decay):
    """The Keras regularizer equal to Caffe/Torch's coupled weight decay.

    Torch's `optim.sgd` adds `weight_decay * w` to each gradient. The gradient of
    `L2(l2)`, i.e. of `l2 * sum(w ** 2)`, is `2 * l2 * w`, so `l2 = weight_decay / 2`
    gives the same update. (Keras' `SGD(weight_decay=...)` is decoupled: it shrinks the
    weights outside the momentum buffer and is a different update.)

    Returns `None` for a decay of zero, so that no regularization loss is created.
    """
    if weight_decay == 0:
        return None
    import keras

    return keras.regularizers.L2(weight_decay / 2)


def is_integer(value):
    """An int or a NumPy integer, not a bool (Python's True is 1, never a count here)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_finite_number(value):
    """An int or float (NumPy's too), finite, not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def validate_weight_decay(weight_decay):
    if not is_finite_number(weight_decay) or weight_decay < 0:
        raise ValueError(
            f"weight_decay must be a number >= 0 (the paper uses 1e-4). Received: weight_decay={weight_decay!r}"
        )
    return float(weight_decay)
