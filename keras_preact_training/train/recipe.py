"""The paper's training recipe as Keras objects, usable on every backend.

Augmentation and normalisation are Keras layers inside the training model, the
learning-rate schedule is a Keras `LearningRateSchedule`, the weight decay is set in
the network (`keras_preact.defaults.weight_regularizer`) and the optimizer applies it
(`CoupledSGD`): `model.fit` on in-memory arrays trains with the paper's recipe under
TensorFlow, JAX or PyTorch. The TensorFlow loop of `keras_preact_training.train.loop` uses the same objects
under `tf.distribute`.
"""

import math

import keras
from keras import ops

import keras_preact
from keras_preact import walks
from keras_preact.pretrained import normalization

from . import augmentation, configs


@keras.saving.register_keras_serializable(package="keras_preact_training")
class WarmupPiecewiseDecay(keras.optimizers.schedules.LearningRateSchedule):
    """A constant learning rate divided by `decay_factor` at each boundary, after a warm-up.

    The paper's CIFAR schedule: 0.1, divided by 10 at 32k and 48k iterations, with
    0.01 for the first 400 iterations. Step s (counted from 0, the optimizer's
    `iterations`) uses `warmup_learning_rate` while s < `warmup_steps`, and
    `learning_rate * decay_factor ** (number of boundaries <= s)` after.

    Args:
        learning_rate: the rate after the warm-up.
        boundaries: steps at which the rate is multiplied by `decay_factor`.
        decay_factor: 0.1 in the paper.
        warmup_steps: steps at `warmup_learning_rate` (400 in the paper; 0 for none).
        warmup_learning_rate: the rate of the warm-up (0.01 in the paper).
    """

    def __init__(self, learning_rate, boundaries, decay_factor=0.1, warmup_steps=0, warmup_learning_rate=0.0):
        if list(boundaries) != sorted(boundaries):
            raise ValueError(f"boundaries must be increasing. Received: boundaries={boundaries!r}")
        self.learning_rate = float(learning_rate)
        self.boundaries = [int(boundary) for boundary in boundaries]
        self.decay_factor = float(decay_factor)
        self.warmup_steps = int(warmup_steps)
        self.warmup_learning_rate = float(warmup_learning_rate)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        decays = ops.sum(
            ops.cast(ops.greater_equal(step, ops.array(self.boundaries + [float("inf")], "float32")), "float32")
        )
        decayed = self.learning_rate * ops.power(self.decay_factor, decays)
        return ops.where(ops.less(step, float(self.warmup_steps)), self.warmup_learning_rate, decayed)

    def get_config(self):
        return dict(
            learning_rate=self.learning_rate,
            boundaries=self.boundaries,
            decay_factor=self.decay_factor,
            warmup_steps=self.warmup_steps,
            warmup_learning_rate=self.warmup_learning_rate,
        )


@keras.saving.register_keras_serializable(package="keras_preact_training")
class WarmupCosineDecay(keras.optimizers.schedules.LearningRateSchedule):
    """A warm-up at a constant rate, then half a cosine from `learning_rate` down to 0.

    SGDR's annealing without restarts (Loshchilov and Hutter, ICLR 2017): step s uses
    `warmup_learning_rate` while s < `warmup_steps`, then
    `learning_rate * (1 + cos(pi * (s - warmup_steps) / (total_steps - warmup_steps))) / 2`,
    which reaches 0 at `total_steps`.

    Args:
        learning_rate: the rate after the warm-up.
        total_steps: the length of training.
        warmup_steps, warmup_learning_rate: as `WarmupPiecewiseDecay`'s.
    """

    def __init__(self, learning_rate, total_steps, warmup_steps=0, warmup_learning_rate=0.0):
        if not 0 <= int(warmup_steps) < int(total_steps):
            raise ValueError(
                f"warmup_steps must be at least 0 and less than total_steps ({total_steps}). "
                f"Received: warmup_steps={warmup_steps!r}"
            )
        self.learning_rate = float(learning_rate)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.warmup_learning_rate = float(warmup_learning_rate)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        progress = (step - self.warmup_steps) / float(self.total_steps - self.warmup_steps)
        annealed = self.learning_rate * 0.5 * (1.0 + ops.cos(math.pi * ops.clip(progress, 0.0, 1.0)))
        return ops.where(ops.less(step, float(self.warmup_steps)), self.warmup_learning_rate, annealed)

    def get_config(self):
        return dict(
            learning_rate=self.learning_rate,
            total_steps=self.total_steps,
            warmup_steps=self.warmup_steps,
            warmup_learning_rate=self.warmup_learning_rate,
        )


def schedule(config, steps_per_epoch):
    """The learning-rate schedule of `config` (see `keras_preact_training.train.configs.Config`)."""
    if config.schedule == "cosine":
        return WarmupCosineDecay(
            config.scaled_learning_rate,
            config.total_steps(steps_per_epoch),
            config.to_steps(config.warmup, steps_per_epoch),
            config.scaled_warmup_learning_rate,
        )
    return WarmupPiecewiseDecay(
        config.scaled_learning_rate,
        [config.to_steps(boundary, steps_per_epoch) for boundary in config.decay_boundaries],
        config.decay_factor,
        config.to_steps(config.warmup, steps_per_epoch),
        config.scaled_warmup_learning_rate,
    )


@keras.saving.register_keras_serializable(package="keras_preact_training")
class CoupledSGD(keras.optimizers.SGD):
    """Keras' SGD with momentum (v <- m v - lr g; w <- w + v, as Caffe's), taking over
    the network's weight decay as Caffe and Torch apply it: g <- g + decay w, before the
    momentum.

    `take_weight_decay(model)` moves each weight's `L2(l2)` regularizer (what
    `keras_preact.defaults.weight_regularizer` sets: decay / 2) into the optimizer as a
    decay of 2 l2 on that weight's gradient, the gradient of the L2 loss itself, and
    removes it from the weight, so that `model.losses` stops counting it. The update is
    the one Keras' SGD makes on the network's regularization loss, to float32 rounding
    (tested), for far fewer operations in a traced training step: the L2 loss costs
    about 16 per weight (its terms and their gradients), the decay here 3. On TensorFlow
    each weight's update is one fused kernel (`ResourceApplyKerasMomentum`, the kernel
    of Keras 2's SGD) where Keras 3's SGD traces about 11 operations; other backends run
    Keras' update. With BatchNorm's kernel averaging its own statistics
    (`keras_preact.base_layers`), a deep network's traced step holds about a third of the
    operations and its first step takes about half the time (docs/benchmarks-history.md, "The first
    training step").
    """

    def __init__(self, learning_rate=0.01, momentum=0.0, nesterov=False, name="sgd", **kwargs):
        # The name Keras gives the first SGD of a process: checkpoints key the optimizer's
        # variables by their paths, so every run, whichever optimizer it was made with,
        # keeps the paths its checkpoints hold.
        super().__init__(learning_rate, momentum=momentum, nesterov=nesterov, name=name, **kwargs)
        self._weight_decays = {}

    def take_weight_decay(self, model):
        """Applies the L2 regularizers of `model`'s trainable weights as coupled decay, and
        removes them from the weights (other regularizers stay losses); returns how many."""
        taken = 0
        for variable in model.trainable_variables:
            regularizer = variable.regularizer
            if type(regularizer) is keras.regularizers.L2:
                self._weight_decays[self._var_key(variable)] = 2 * regularizer.l2
                variable.regularizer = None
                taken += 1
        return taken

    def weight_decay_of(self, variable):
        """The coupled decay this optimizer applies to `variable` (0 for none)."""
        return self._weight_decays.get(self._var_key(variable), 0.0)

    def update_step(self, gradient, variable, learning_rate):
        if keras.backend.backend() == "tensorflow" and self.momentum:
            return self._apply_fused(gradient, variable, _TensorsOnce(learning_rate, self.momentum))
        decay = self.weight_decay_of(variable)
        if decay:
            gradient = ops.add(ops.cast(gradient, variable.dtype), ops.multiply(variable, decay))
        return super().update_step(gradient, variable, learning_rate)

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        # Outside tf.distribute (one device, the default strategy) on TensorFlow, every
        # weight in one pass: the rate, the momentum and each distinct decay become one
        # tensor each for the whole step, not one each per weight, and the gradients skip
        # Keras' all-reduce, which has nothing to sum for one replica but traces an
        # identity per weight (docs/benchmarks-history.md, "The first training step").
        if keras.backend.backend() != "tensorflow" or not self.momentum:
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        import tensorflow as tf

        if tf.distribute.has_strategy():
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        tensors = _TensorsOnce(learning_rate, self.momentum)
        for gradient, variable in zip(grads, trainable_variables):
            self._apply_fused(gradient, variable, tensors)

    def _apply_fused(self, gradient, variable, tensors):
        """g <- g + decay w; then Keras 2's SGD kernel: v <- m v - lr g; w <- w + v."""
        import tensorflow as tf

        weight = variable.value if isinstance(variable, keras.Variable) else variable  # a tf.Variable
        gradient = tf.cast(gradient, weight.dtype)
        decay = self.weight_decay_of(variable)
        if decay:
            gradient = gradient + tensors.get(decay, weight.dtype) * weight
        momentum = self.momentums[self._get_variable_index(variable)]
        tf.raw_ops.ResourceApplyKerasMomentum(
            var=weight.handle,
            accum=momentum.value.handle,
            lr=tensors.get("learning_rate", weight.dtype),
            grad=gradient,
            momentum=tensors.get("momentum", weight.dtype),
            use_nesterov=self.nesterov,
        )


class _TensorsOnce:
    """The numbers of one optimizer step as graph tensors, each made once per dtype: the
    learning rate (read once, where it is a variable), the momentum, and decays by value."""

    def __init__(self, learning_rate, momentum):
        self.named = {"learning_rate": learning_rate, "momentum": momentum}
        self.made = {}

    def get(self, key, dtype):
        import tensorflow as tf

        if (key, dtype) not in self.made:
            self.made[key, dtype] = tf.cast(self.named.get(key, key), dtype)
        return self.made[key, dtype]


def optimizer(config, steps_per_epoch, model=None):
    """SGD with momentum, as Caffe's: v <- m v - lr g; w <- w + v (`CoupledSGD`), which
    takes over `model`'s weight decay where a model is given; with a moving average of the
    weights where `config.average_momentum` (`keras.optimizers.Optimizer`'s `use_ema`:
    `optimizer.finalize_variable_values(model.trainable_variables)` puts it in the model)."""
    average = dict(use_ema=True, ema_momentum=config.average_momentum) if config.average_momentum else {}
    sgd = CoupledSGD(schedule(config, steps_per_epoch), momentum=config.momentum, nesterov=config.nesterov, **average)
    if model is not None:
        sgd.take_weight_decay(model)
    return keras.optimizers.LossScaleOptimizer(sgd) if config.precision == "mixed_float16" else sgd


def preprocessing(config, seed=None):
    """The layers between raw pixels (0-255) and the network: augmentation, normalisation,
    and Cutout after it (`augmentation.RandomCutout`, where `config.cutout`)."""
    layers = []
    if config.crop_padding:
        layers.append(augmentation.RandomPaddedCrop(config.crop_padding, seed=seed, name="random_padded_crop"))
    if config.horizontal_flip:
        layers.append(keras.layers.RandomFlip("horizontal", seed=seed, name="random_flip"))
    layers.append(normalization(config.normalization_mean, config.normalization_std))
    if config.cutout:
        layers.append(augmentation.RandomCutout(config.cutout, seed=seed, name="random_cutout"))
    return layers


def training_model(config, input_shape, classes, seed=None):
    """Raw pixels -> augmentation (training only) -> normalisation -> the network (logits).

    Example, the recipe with plain `model.fit` on arrays (any backend):

    >>> config = keras_preact_training.train.configs.CONFIGS["cifar10_paper"]
    >>> model = training_model(config, (32, 32, 3), classes=10)
    >>> model.compile(optimizer(config, 390, model), loss(), metrics=["accuracy"])
    >>> model.fit(images, labels, batch_size=128, epochs=164)  # images: pixels 0-255
    """
    network = network_of(config, input_shape, classes)
    return keras.Sequential(
        [keras.Input(input_shape, name="pixels"), *preprocessing(config, seed), network], name=f"train_{network.name}"
    )


def network_of(config, input_shape, classes):
    """The network of `config` (model, unit, shortcut, merge, rematerialization, loop, BatchNorm's
    path), ending in logits."""
    options = {} if config.unit is None else dict(unit=config.unit)
    if config.shortcut != "identity":
        options["shortcut"] = config.shortcut
    network = keras_preact.get_model(
        config.model,
        input_shape=input_shape,
        classes=classes,
        classifier_activation=None,
        weight_decay=config.weight_decay,
        rematerialize=config.rematerialize,
        # Loops cannot reduce BatchNorm's statistics across replicas (Config's check).
        scan_units=False if config.scan_units is None and config.synchronized_batch_norm else config.scan_units,
        merge=configs.MERGES[config.merge](config),
        **options,
    )
    walks.set_fused(network, config.fused_batch_norm)
    return network


def loss(label_smoothing=0.0, reduction="sum_over_batch_size"):
    """Cross-entropy of integer labels and logits; with `label_smoothing` (`Config`'s), of the
    smoothed one-hot targets. `reduction=None` gives each example's loss."""
    if not label_smoothing:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)
    smoothed = keras.losses.CategoricalCrossentropy(
        from_logits=True, label_smoothing=label_smoothing, reduction=reduction
    )

    def smoothed_cross_entropy(labels, logits):
        return smoothed(ops.one_hot(ops.cast(labels, "int32"), ops.shape(logits)[-1]), logits)

    return smoothed_cross_entropy
