"""Residual units: one layer per activation placement the paper studies (its Fig. 4).

Notation of the paper: y_l = h(x_l) + F(x_l, W_l), x_{l+1} = f(y_l). Every unit here
holds the same parts, which its `call()` arranges as in the figure:

- the residual branch F: the convolutions of its *form* (`FORMS`: two 3x3 for
  "basic", 1x1-3x3-1x1 with 4x expansion for "bottleneck", one 3x3 for the "single"
  layer of Table 3's "ResNet-110 (1layer skip)") and one BatchNorm per convolution;
- the shortcut h (`keras_preact.shortcuts`): identity, zero padding or projection;
- the merge (`keras_preact.merges`): addition, or one of Fig. 2's variants.

Reference:
    He, Zhang, Ren, Sun. "Identity Mappings in Deep Residual Networks", ECCV 2016.
    https://arxiv.org/abs/1603.05027
"""

# Annotations stay text: the module imported by Keras' own import (the layers' registration)
# must not evaluate another module's classes while that module is half-imported.
from __future__ import annotations

import dataclasses

import keras
from keras import ops

from keras_preact import base_layers, defaults, merges, shortcuts


@dataclasses.dataclass(frozen=True)
class BranchForm:
    """The convolutions of a residual branch: their kernel sizes and the expansion of the last."""

    kernel_sizes: tuple
    expansion: int

    def widths(self, filters):
        return [filters] * (len(self.kernel_sizes) - 1) + [filters * self.expansion]

    def strides(self, strides, stride_on):
        """The stride of each convolution: only one of them is strided."""
        strided = 0 if stride_on == "first" else self.kernel_sizes.index(3)
        return [strides if index == strided else 1 for index in range(len(self.kernel_sizes))]


FORMS = {
    "basic": BranchForm(kernel_sizes=(3, 3), expansion=1),
    "bottleneck": BranchForm(kernel_sizes=(1, 3, 1), expansion=4),
    "single": BranchForm(kernel_sizes=(3,), expansion=1),
}

# Where a bottleneck unit's stride sits: on its first (1x1) convolution as in the official
# CIFAR code (resnet-1k-layers), or on its 3x3 convolution as in fb.resnet.torch's
# ImageNet pre-activation nets. Basic and single units stride their first convolution.
STRIDE_POSITIONS = ("first", "3x3")

# What a pre-activated unit applies its pre-activation to (official code: `both_preact`
# for the first unit of a stage, `no_preact` for the first unit after the stem).
PREACTIVATIONS = ("residual", "shared", "none")


def check_choice(argument, value, choices):
    """Raises a ValueError naming `argument`, the accepted `choices` and the received `value`."""
    if value not in choices:
        raise ValueError(f"{argument} must be one of {list(choices)}. Received: {argument}={value!r}")


class ResidualUnit(keras.layers.Layer):
    """Base class of the units: builds the branch, the shortcut and the merge.

    Args:
        filters: width of the residual branch; the unit outputs `filters * 4` channels
            for the bottleneck form, `filters` otherwise.
        form: "basic", "bottleneck" or "single" (see `FORMS`).
        strides: 1, or 2 to halve the resolution.
        shortcut: "identity", "zero_pad" (option A of [1]) or "projection" (option B).
        merge: a layer from `keras_preact.merges` combining h(x) and F(x);
            `None` for `merges.Addition()`. The unit uses a copy of it, with the
            unit's dtype policy and weight decay.
        stride_on: "first" or "3x3": which convolution of a bottleneck is strided.
        weight_decay: the paper's coupled weight decay on every weight of the unit
            (see `defaults.weight_regularizer`).
        rematerialize: while training, keep only the unit's input for the backward
            pass and compute its branches again there (`keras.remat`): less memory
            for about one more forward pass. BatchNorm's moving averages are updated
            once, outside the recomputed function, exactly as without.
        **kwargs: `keras.layers.Layer` arguments (`name`, `dtype`, ...).
    """

    # Whether a 1x1 projection shortcut is followed by BatchNorm.
    normalize_projection = True
    # Layers a network appends after its last unit: the appendix's "extra activation
    # right after [the last unit's] element-wise addition" for pre-activation units.
    final_activation = ()

    def __init__(
        self,
        filters: int,
        form: str = "basic",
        strides: int = 1,
        shortcut: str = "identity",
        merge: merges.Merge | None = None,
        stride_on: str = "first",
        weight_decay: float = 0.0,
        rematerialize: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not defaults.is_integer(filters) or filters < 1:
            raise ValueError(f"filters must be a positive integer. Received: filters={filters!r}")
        filters = int(filters)
        check_choice("form", form, FORMS)
        check_choice("strides", strides, (1, 2))
        check_choice("shortcut", shortcut, shortcuts.SHORTCUTS)
        check_choice("stride_on", stride_on, STRIDE_POSITIONS)
        if merge is not None and not isinstance(merge, merges.Merge):
            raise ValueError(f"merge must be a layer from keras_preact.merges or None. Received: merge={merge!r}")
        self.filters = filters
        self.form = form
        self.strides = strides
        self.shortcut = shortcut
        self.stride_on = stride_on
        self.weight_decay = defaults.validate_weight_decay(weight_decay)
        if not isinstance(rematerialize, bool):
            raise ValueError(f"rematerialize must be True or False. Received: rematerialize={rematerialize!r}")
        self.rematerialize = rematerialize

        branch = FORMS[form]
        self.output_channels = branch.widths(filters)[-1]
        self.convs = [
            base_layers.SymmetricConv2D(
                width, kernel_size, stride, self.weight_decay, name=f"conv{index}", dtype=self.dtype_policy
            )
            for index, (width, kernel_size, stride) in enumerate(
                zip(branch.widths(filters), branch.kernel_sizes, branch.strides(strides, stride_on)), start=1
            )
        ]
        self.shortcut_path = shortcuts.make_shortcut(
            shortcut, self.output_channels, strides, self.normalize_projection, self.weight_decay, self.dtype_policy
        )
        self.merge = merges.copy_for_unit(merge or merges.Addition(), self.weight_decay, self.dtype_policy)

    def batch_norms(self, indices):
        """One BatchNorm per index, named bn1, bn2, ... after the convolution they go with."""
        return [base_layers.batch_norm(self.weight_decay, f"bn{index}", self.dtype_policy) for index in indices]

    def branches(self, inputs):
        """(h(x), F(x)): the shortcut path and the residual branch, before they merge.

        Each unit's `call()` merges them as its figure does; `keras_preact.analysis`
        measures them.
        """
        raise NotImplementedError(f"{type(self).__name__} must define its branches")

    def computed_branches(self, inputs, training):
        """`branches(inputs)`, rematerialized while training if the unit is asked to.

        The recomputed function returns the batch statistics of its BatchNorms with
        h(x) and F(x), and the moving averages are updated here, once.
        """
        if not (self.rematerialize and training):
            return self.branches(inputs)
        collectors = []

        def forward(x):
            with base_layers.StatisticsCollector(self.all_batch_norms()) as collector:
                shortcut, residual = self.branches(x)
            collectors.append(collector)
            return shortcut, residual, tuple(collector.statistics)

        shortcut, residual, statistics = keras.remat(forward)(inputs)
        for norm, (mean, variance) in zip(collectors[0].called, statistics):
            norm.update_moving_statistics(ops.stop_gradient(mean), ops.stop_gradient(variance))
        return shortcut, residual

    def all_batch_norms(self):
        return [layer for layer in self._flatten_layers() if isinstance(layer, base_layers.BatchNorm)]

    def folding_pairs(self):
        """The (convolution, BatchNorm) pairs of the unit in which the BatchNorm reads the
        convolution's output and nothing else reads it: those `keras_preact.fold_batch_norms`
        folds. In the post-activation units, every convolution with its own BatchNorm."""
        return self.shortcut_path.folding_pairs() + list(zip(self.convs, self.norms, strict=True))

    def post_activation_branch(self, inputs, normalize_last=True):
        """conv-BN-ReLU, ..., conv-BN: F of the original unit (Fig. 4(a))."""
        residual = inputs
        for conv, norm in zip(self.convs[:-1], self.norms):
            residual = ops.relu(norm(conv(residual)))
        residual = self.convs[-1](residual)
        return self.norms[len(self.convs) - 1](residual) if normalize_last else residual

    # Every call() takes `training`, as Keras layers do, so that callers that pass it
    # explicitly (a Functional model, `stateless_call`) can; Keras' call context hands
    # it on to the BatchNorms and the merge.

    def build(self, input_shape):
        # Calling call() on a symbolic tensor builds every sublayer with the shape it sees
        # there; the shortcut's build checks that the unit can change the shape as asked.
        self.call(keras.KerasTensor(input_shape, dtype=self.compute_dtype))

    def compute_output_shape(self, input_shape):
        return self.shortcut_path.compute_output_shape(input_shape)

    def get_config(self):
        config = super().get_config()
        merge = keras.saving.serialize_keras_object(self.merge)
        # The unit builds its merge when it is built itself.
        merge.pop("build_config", None)
        config.update(
            filters=self.filters,
            form=self.form,
            strides=self.strides,
            shortcut=self.shortcut,
            merge=merge,
            stride_on=self.stride_on,
            weight_decay=self.weight_decay,
            rematerialize=self.rematerialize,
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["merge"] = keras.saving.deserialize_keras_object(config["merge"])
        return cls(**config)


@keras.saving.register_keras_serializable(package="keras_preact")
class OriginalUnit(ResidualUnit):
    """The original residual unit of [1], the paper's Fig. 4(a).

    x_{l+1} = ReLU(h(x_l) + F(x_l)), F = conv-BN-ReLU-conv-BN (three layers in a
    bottleneck). With `merges.NoShortcut()` this is a unit of a plain network, and
    with the other merges the shortcut variants of Fig. 2 and Table 1.

    Example:

    >>> unit = OriginalUnit(16, merge=keras_preact.merges.ExclusiveGating(gate_bias=-6))
    """

    def __init__(self, filters: int, **kwargs):
        super().__init__(filters, **kwargs)
        self.norms = self.batch_norms(range(1, len(self.convs) + 1))

    def branches(self, inputs):
        return self.shortcut_path(inputs), self.post_activation_branch(inputs)

    def call(self, inputs, training=None):
        shortcut, residual = self.computed_branches(inputs, training)
        return ops.relu(self.merge(shortcut, residual))


@keras.saving.register_keras_serializable(package="keras_preact")
class BatchNormAfterAdditionUnit(ResidualUnit):
    """Fig. 4(b): BatchNorm moved after the addition, x_{l+1} = ReLU(BN(h(x) + F(x)))."""

    def __init__(self, filters: int, **kwargs):
        super().__init__(filters, **kwargs)
        self.norms = self.batch_norms(range(1, len(self.convs) + 1))

    def branches(self, inputs):
        return self.shortcut_path(inputs), self.post_activation_branch(inputs, normalize_last=False)

    def folding_pairs(self):
        # The last BatchNorm reads the sum, not the last convolution.
        return self.shortcut_path.folding_pairs() + list(zip(self.convs[:-1], self.norms[:-1], strict=True))

    def call(self, inputs, training=None):
        shortcut, residual = self.computed_branches(inputs, training)
        return ops.relu(self.norms[-1](self.merge(shortcut, residual)))


@keras.saving.register_keras_serializable(package="keras_preact")
class ReLUBeforeAdditionUnit(ResidualUnit):
    """Fig. 4(c): the ReLU moved into the branch, x_{l+1} = h(x) + ReLU(F(x)).

    The branch's output is then never negative, which the paper blames for its worse
    results (Table 2).
    """

    def __init__(self, filters: int, **kwargs):
        super().__init__(filters, **kwargs)
        self.norms = self.batch_norms(range(1, len(self.convs) + 1))

    def branches(self, inputs):
        return self.shortcut_path(inputs), ops.relu(self.post_activation_branch(inputs))

    def call(self, inputs, training=None):
        shortcut, residual = self.computed_branches(inputs, training)
        return self.merge(shortcut, residual)


class PreActivatedUnit(ResidualUnit):
    """Base of the units with the activation before the weights (Fig. 4(d) and (e)).

    Args:
        preactivation: what the first activation applies to. "residual" (most
            units): the residual branch only, the shortcut reads x_l. "shared": once,
            before the paths split, both reading the activated tensor; the official
            code does this in the first unit of a stage, whose shortcut changes shape
            ("these projection shortcuts are also with pre-activation"). "none": the
            input is already activated, by the stem in the first unit of a network
            (appendix: "we adopt the first activation right after conv1 and before
            splitting into two paths").
        **kwargs: the `ResidualUnit` arguments.
    """

    def __init__(self, filters: int, preactivation: str = "residual", **kwargs):
        super().__init__(filters, **kwargs)
        check_choice("preactivation", preactivation, PREACTIVATIONS)
        self.preactivation = preactivation

    def split(self, inputs, activate):
        """Returns (shortcut input, residual input) for this unit's `preactivation`."""
        if self.preactivation == "none":
            return inputs, inputs
        activated = activate(inputs)
        return (inputs if self.preactivation == "residual" else activated), activated

    def get_config(self):
        config = super().get_config()
        config["preactivation"] = self.preactivation
        return config


@keras.saving.register_keras_serializable(package="keras_preact")
class ReLUOnlyPreActivationUnit(PreActivatedUnit):
    """Fig. 4(d): ReLU before each convolution, BatchNorm after it: ReLU-conv-BN, ReLU-conv-BN.

    x_{l+1} = h(x_l) + F(x_l); a network of these units ends with an extra ReLU.
    """

    final_activation = ("relu",)

    def __init__(self, filters: int, **kwargs):
        super().__init__(filters, **kwargs)
        self.norms = self.batch_norms(range(1, len(self.convs) + 1))

    def branches(self, inputs):
        shortcut_input, activated = self.split(inputs, ops.relu)
        residual = self.norms[0](self.convs[0](activated))
        for conv, norm in zip(self.convs[1:], self.norms[1:]):
            residual = norm(conv(ops.relu(residual)))
        return self.shortcut_path(shortcut_input), residual

    def call(self, inputs, training=None):
        shortcut, residual = self.computed_branches(inputs, training)
        return self.merge(shortcut, residual)


@keras.saving.register_keras_serializable(package="keras_preact")
class PreActivationUnit(PreActivatedUnit):
    """The full pre-activation unit, the paper's Fig. 4(e) and its proposal.

    x_{l+1} = h(x_l) + F(x_l) with F = BN-ReLU-conv, BN-ReLU-conv (three BN-ReLU-conv
    in a bottleneck), and nothing after the addition: with h the identity, x_L = x_l +
    sum of the residuals of the units between (the paper's Eqn. 4), and the gradient
    reaches every unit unchanged through the shortcuts (Eqn. 5). A network of these
    units ends with an extra BN-ReLU.

    The 1x1 projection shortcut has no BatchNorm of its own: it reads an activated
    tensor, as in the official code.

    Example:

    >>> unit = PreActivationUnit(16, form="bottleneck", strides=2, shortcut="projection",
    ...                          preactivation="shared")
    >>> unit(keras.ops.ones((1, 32, 32, 64))).shape
    (1, 16, 16, 64)
    """

    normalize_projection = False
    final_activation = ("batch_norm", "relu")

    def __init__(self, filters: int, **kwargs):
        super().__init__(filters, **kwargs)
        first = 2 if self.preactivation == "none" else 1
        self.norms = self.batch_norms(range(first, len(self.convs) + 1))

    @property
    def branch_norms(self):
        """The BatchNorms inside the residual branch, each after a convolution but the last."""
        return self.norms if self.preactivation == "none" else self.norms[1:]

    def branches(self, inputs):
        shortcut_input, activated = self.split(inputs, lambda x: ops.relu(self.norms[0](x)))
        residual = self.convs[0](activated)
        for norm, conv in zip(self.branch_norms, self.convs[1:]):
            residual = conv(ops.relu(norm(residual)))
        return self.shortcut_path(shortcut_input), residual

    def folding_pairs(self):
        # The pre-activation reads the unit's input; the last convolution's output goes
        # to the addition. The projection shortcut has no BatchNorm of its own.
        return list(zip(self.convs[:-1], self.branch_norms, strict=True))

    def call(self, inputs, training=None):
        shortcut, residual = self.computed_branches(inputs, training)
        return self.merge(shortcut, residual)


# The units by the names the network builders take, in the order of Fig. 4.
UNITS = {
    "original": OriginalUnit,
    "bn_after_addition": BatchNormAfterAdditionUnit,
    "relu_before_addition": ReLUBeforeAdditionUnit,
    "relu_only_preactivation": ReLUOnlyPreActivationUnit,
    "preactivation": PreActivationUnit,
}
