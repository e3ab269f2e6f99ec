"""How signals and gradients propagate through residual units: the paper's argument, measured.

With identity shortcuts and nothing after the addition (the full pre-activation unit),
any deeper unit L is the shallower unit l plus the residuals between (Eqn. 4):
x_L = x_l + sum_{i=l}^{L-1} F(x_i), and the gradient reaches x_l unchanged through
the shortcuts (Eqn. 5): dE/dx_l = dE/dx_L (1 + d/dx_l sum F). Shortcuts scaled by
lambda multiply that direct term by prod lambda_i (Eqns. 7-8), which vanishes or
explodes with depth; gates and 1x1 convolutions do the same in a data-dependent way.

`propagation()` measures, for every unit of a network and a batch of images, the
norms of its output, shortcut and residual, and of the gradients at its input and of
its weights. `identity_mapping()` checks Eqns. 4-5 exactly on units whose residual
branches are zeroed. Gradients need the TensorFlow, JAX or PyTorch backend.

Reference:
    He, Zhang, Ren, Sun. "Identity Mappings in Deep Residual Networks", ECCV 2016.
"""

import dataclasses
import math
from collections.abc import Callable, Sequence

import keras
import numpy as np
from numpy.typing import ArrayLike

from keras_preact import layouts, walks
from keras_preact import units as unit_layers


@dataclasses.dataclass(frozen=True)
class UnitStatistics:
    """One unit's signals for a batch. Norms are root-mean-square over the batch of each
    example's L2 norm (the norm of the batch tensor / sqrt(batch size))."""

    name: str
    output_norm: float
    shortcut_norm: float
    residual_norm: float
    input_gradient_norm: float
    weight_gradient_norm: float

    @property
    def residual_to_shortcut(self):
        """||F(x_l)|| / ||h(x_l)||: how much a unit changes its input."""
        return self.residual_norm / self.shortcut_norm


@dataclasses.dataclass(frozen=True)
class IdentityCheck:
    """The largest deviations of x_L from x_l and of dx_L/dx_l from the identity."""

    units: int
    output_error: float
    jacobian_error: float

    @property
    def passed(self):
        """Exactly the identity, as Eqns. 4-5 predict for pre-activation units."""
        return self.output_error == 0.0 and self.jacobian_error == 0.0


def residual_units(model: keras.Model) -> list[unit_layers.ResidualUnit]:
    """The residual units of `model`, in order; a model that runs units in loops
    (`scan_units=True`) is first rebuilt with separate units (`layouts.separate_units`,
    the same weights), whose units these are.
    """
    model = layouts.separate_units(model)
    return [layer for layer in model.layers if isinstance(layer, unit_layers.ResidualUnit)]


def propagation(
    model: keras.Model, images: ArrayLike, labels: ArrayLike, loss: Callable | None = None
) -> list[UnitStatistics]:
    """Forward and backward statistics of every residual unit, in training mode.

    Args:
        model: a keras-preact network, or any Keras model whose layers form a chain
            (each reads the previous one's output) and include residual units. Units
            run as loops are measured one by one in the same network of separate
            units (`layouts.separate_units`).
        images: a batch of inputs the model takes.
        labels: integer labels of the batch.
        loss: `loss(labels, outputs)`; cross-entropy on the model's outputs (logits,
            or probabilities where the last layer's activation is softmax) by default.

    Returns:
        A list of `UnitStatistics`, one per unit. The model is left unchanged
        (BatchNorm's moving statistics included).

    Raises:
        ValueError: for a model that is not a chain or has no residual unit, or a
            backend other than tensorflow, jax and torch.
    """
    model = layouts.separate_units(model)
    layers = walks.chain_layers(model)
    units = [layer for layer in layers if isinstance(layer, unit_layers.ResidualUnit)]
    if not units:
        raise ValueError(f"propagation() needs a model with residual units. Received: model={model.name!r}")
    if loss is None:
        from_logits = getattr(layers[-1], "activation", None) is not keras.activations.softmax
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits)
    images = keras.ops.convert_to_tensor(images)

    def forward(probes):
        """The network with a zero probe added to each unit's input: d loss / d probe is
        d loss / d x_l. Returns the loss, the unit inputs and the unit outputs."""
        x, inputs, outputs = images, [], []
        for layer in layers:
            if isinstance(layer, unit_layers.ResidualUnit):
                x = x + probes[len(inputs)]
                inputs.append(x)
            x = layer(x, training=True)
            if isinstance(layer, unit_layers.ResidualUnit):
                outputs.append(x)
        return loss(labels, x), inputs, outputs

    probes = [keras.ops.zeros((images.shape[0],) + tuple(unit.input.shape[1:])) for unit in units]
    variables = model.trainable_variables
    (weight_gradients, input_gradients), (unit_inputs, unit_outputs) = _gradients(forward, variables, probes)
    gradient_of = {id(variable): gradient for variable, gradient in zip(variables, weight_gradients)}

    statistics = []
    for unit, unit_input, unit_output, input_gradient in zip(units, unit_inputs, unit_outputs, input_gradients):
        with keras.StatelessScope():
            shortcut, residual = _Branches(unit)(unit_input, training=True)
        unit_weight_gradients = [gradient_of[id(variable)] for variable in unit.trainable_variables]
        statistics.append(
            UnitStatistics(
                name=unit.name,
                output_norm=_norm(unit_output),
                shortcut_norm=_norm(shortcut),
                residual_norm=_norm(residual),
                input_gradient_norm=_norm(input_gradient),
                # A weight the loss does not reach (a plain unit's unused projection) has no gradient.
                weight_gradient_norm=math.sqrt(
                    sum(
                        float(np.sum(np.square(keras.ops.convert_to_numpy(g))))
                        for g in unit_weight_gradients
                        if g is not None
                    )
                ),
            )
        )
    return statistics


def identity_mapping(
    units: Sequence[unit_layers.ResidualUnit], inputs: ArrayLike, training: bool = True
) -> IdentityCheck:
    """Eqns. 4-5 checked exactly: with every residual branch zeroed, does the stack of
    `units` map x_l to x_L = x_l, with dx_L/dx_l = I?

    Works on copies of the units, their last convolution set to zero (F = 0); the units
    themselves are not changed. For a full pre-activation unit both hold exactly; the
    original unit's ReLU after the addition clips negative signals and their gradient.

    Args:
        units: residual units that keep the shape of their input (e.g. a stage without
            its first unit: `stage_units(model, 1)`).
        inputs: x_l, a batch of one example (the Jacobian is size x size).
        training: BatchNorm's mode.

    Returns:
        An `IdentityCheck`.
    """
    inputs = np.asarray(inputs, "float32")
    if inputs.shape[0] != 1:
        raise ValueError(f"inputs must be a batch of one example. Received: inputs.shape={inputs.shape}")
    copies = _without_residuals(units, inputs.shape)

    def stack(x):
        for copy in copies:
            x = copy(x, training=training)
        return x

    with keras.StatelessScope():
        outputs = keras.ops.convert_to_numpy(stack(keras.ops.convert_to_tensor(inputs)))
    jacobian = _jacobian(stack, inputs)
    return IdentityCheck(
        units=len(copies),
        output_error=float(np.max(np.abs(outputs - inputs))),
        jacobian_error=float(np.max(np.abs(jacobian - np.eye(inputs.size)))),
    )


def shortcut_gains(units: Sequence[unit_layers.ResidualUnit], inputs: ArrayLike, training: bool = True) -> list[float]:
    """Eqn. 8's direct term, measured: ||dE/dx_l|| / ||dE/dx_L|| for every unit l of the
    stack, on copies of `units` with their residual branches zeroed (F = 0).

    What is left of the gradient is what the shortcuts pass on: 1 for identity shortcuts
    (Eqn. 5), prod lambda_i for shortcuts scaled by lambda (Eqn. 8), prod (1 - g) for
    gates. E = sum(x_L * R) with R fixed random; x_L is the output of the last unit.

    Args:
        units: residual units that keep the shape of their input.
        inputs: x_l, a batch.

    Returns:
        A list of len(units) + 1 gains, for the input of each unit and for x_L (1.0).
    """
    inputs = np.asarray(inputs, "float32")
    copies = _without_residuals(units, inputs.shape)
    projection = keras.ops.convert_to_tensor(np.random.default_rng(0).normal(size=inputs.shape).astype("float32"))

    def forward(probes):
        x, unit_inputs = keras.ops.convert_to_tensor(inputs), []
        for copy, probe in zip(copies, probes):
            x = x + probe
            unit_inputs.append(x)
            x = copy(x, training=training)
        x = x + probes[-1]
        return keras.ops.sum(x * projection), unit_inputs, [x]

    probes = [keras.ops.zeros(inputs.shape) for _ in range(len(copies) + 1)]
    (_, gradients), _ = _gradients(forward, [], probes)
    norms = [_norm(gradient) for gradient in gradients]
    return [norm / norms[-1] for norm in norms]


def set_batch_norm_statistics(model: keras.Model, images: ArrayLike) -> None:
    """Sets every BatchNorm's moving mean and variance to the statistics of `images`.

    An untrained deep network has moving statistics of 0 and 1, and in inference mode a
    pre-activation net whose residuals add up over hundreds of units overflows. With the
    statistics of a batch, the inference-mode output on that batch equals the
    training-mode one, up to the moving variance's Bessel correction (n / (n - 1), n
    the values per channel; see `keras_preact.base_layers.BatchNorm`): what export and
    serving tests of untrained networks need.
    """
    layers = walks.batch_norms(model)
    momenta = [layer.momentum for layer in layers]
    for layer in layers:
        layer.momentum = 0.0
    try:
        model(images, training=True)
    finally:
        for layer, momentum in zip(layers, momenta):
            layer.momentum = momentum


def stage_units(model: keras.Model, stage: int) -> list[unit_layers.ResidualUnit]:
    """The units of `stage` (1, 2, ...) of a keras-preact network whose shortcut is the identity."""
    prefix = f"stage{stage}_"
    units = [unit for unit in residual_units(model) if unit.name.startswith(prefix) and unit.shortcut == "identity"]
    if not units:
        raise ValueError(f"The model has no unit with an identity shortcut in stage {stage}. Received: stage={stage!r}")
    return units


def _without_residuals(units, input_shape):
    """Copies of `units`, built for `input_shape`, with their last convolution zeroed: F = 0."""
    copies = []
    for unit in units:
        copy = type(unit).from_config(unit.get_config())
        copy.build(input_shape)
        copy.set_weights(unit.get_weights())
        kernel = copy.convs[-1].kernel
        kernel.assign(keras.ops.zeros(kernel.shape))
        copies.append(copy)
    return copies


class _Branches(keras.layers.Layer):
    """Calls a unit's `branches()` inside a layer call, so that `training` reaches its BatchNorms."""

    def __init__(self, unit):
        super().__init__(name=f"{unit.name}_branches")
        self.unit = unit

    def call(self, inputs, training=None):
        return self.unit.branches(inputs)


def _norm(tensor):
    array = keras.ops.convert_to_numpy(tensor).astype("float64")
    return float(np.linalg.norm(array) / math.sqrt(array.shape[0]))


# The backends whose automatic differentiation `_gradients` and `_jacobian` call.
BACKENDS = ("tensorflow", "jax", "torch")


def _unsupported(backend):
    return ValueError(
        f"keras_preact.analysis computes gradients on the {', '.join(BACKENDS)} backends. Received: {backend}"
    )


def _gradients(forward, variables, probes):
    """((d loss / d variables, d loss / d probes), (unit inputs, unit outputs)), statelessly."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        probes = [tf.convert_to_tensor(probe) for probe in probes]
        with tf.GradientTape() as tape:
            tape.watch(probes)
            with keras.StatelessScope():
                loss, inputs, outputs = forward(probes)
        return tape.gradient(loss, ([variable.value for variable in variables], probes)), (inputs, outputs)
    if backend == "jax":
        import jax

        def pure(values, probes):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                loss, inputs, outputs = forward(probes)
            return loss, (inputs, outputs)

        gradients, signals = jax.grad(pure, argnums=(0, 1), has_aux=True)([v.value for v in variables], probes)
        return gradients, signals
    if backend == "torch":
        import torch

        probes = [keras.ops.convert_to_tensor(probe).requires_grad_() for probe in probes]
        values = [variable.value for variable in variables]
        with torch.enable_grad(), keras.StatelessScope():
            loss, inputs, outputs = forward(probes)
        gradients = torch.autograd.grad(loss, values + probes, allow_unused=True)
        return (list(gradients[: len(values)]), list(gradients[len(values) :])), (inputs, outputs)
    raise _unsupported(backend)


def _jacobian(function, inputs):
    """d function(inputs) / d inputs as a (size, size) matrix, statelessly."""
    backend = keras.backend.backend()
    size = inputs.size
    if backend == "tensorflow":
        import tensorflow as tf

        x = tf.constant(inputs)
        with tf.GradientTape() as tape:
            tape.watch(x)
            with keras.StatelessScope():
                y = function(x)
        return tape.jacobian(y, x).numpy().reshape(size, size)
    if backend == "jax":
        import jax

        def pure(x):
            with keras.StatelessScope():
                return function(x)

        return np.asarray(jax.jacfwd(pure)(inputs)).reshape(size, size)
    if backend == "torch":
        import torch

        def stateless(x):
            with keras.StatelessScope():
                return function(x)

        # vectorize: all rows in one batched backward pass (torch.vmap), not one pass per row.
        with torch.enable_grad():
            jacobian = torch.autograd.functional.jacobian(
                stateless, keras.ops.convert_to_tensor(inputs), vectorize=True
            )
        return keras.ops.convert_to_numpy(jacobian).reshape(size, size)
    raise _unsupported(backend)
