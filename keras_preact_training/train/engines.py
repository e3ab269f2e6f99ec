"""The step engines of `keras-preact train`: how one backend builds the training model and runs
its steps, behind the one interface the loop (`keras_preact_training.train.loop.train`) uses, `StepEngine`.

- `TensorFlowSteps` (`tensorflow_steps`): Keras' TensorFlow backend under a `tf.distribute`
  strategy.
- `JaxSteps`: one jitted function of the network's and the optimizer's values, on one device
  or on every device with Keras' data parallelism (`data_parallel`).
- `TorchSteps`: PyTorch's autograd and the Keras optimizer on one device.

All three compute the same step (the recipe's loss averaged over the batch, the network's own
losses, the recipe's optimizer) and keep the network in Keras' variables between steps
(after `synchronize`), which the checkpoints (`keras_preact_training.train.checkpoints`) save and restore.
Only `TensorFlowSteps` needs TensorFlow; `configure` sets it up where it is installed.
"""

import typing

import keras
import numpy as np

from .. import tensorflow_import
from ..data import datasets
from . import data_parallel, precision, recipe


class StepEngine(typing.Protocol):
    """What the training loop asks of a backend's engine."""

    chief: bool  # whether this process writes the run's files (one worker of several does)

    def build(self, dataset, steps_per_epoch):
        """Builds and returns (training model, optimizer), the optimizer's variables built."""

    def loaded(self):
        """Called after a checkpoint was loaded into Keras' variables (or none was): takes the
        engine's state from them."""

    def start(self, split, steps_per_epoch, first_step, total_steps):
        """Begins reading the training batches of steps first_step + 1 .. total_steps."""

    def step(self):
        """Runs one training step; returns (mean loss, correct answers) of its batch as floats."""

    def synchronize(self):
        """Puts the engine's state into Keras' variables, as every replica and worker holds it:
        the network evaluated, averaged or saved."""

    def predict(self, images):
        """Logits of the network in Keras' variables for a batch of NumPy images."""


def for_backend(config):
    """The step engine of Keras' backend for `config`.

    Raises:
        ValueError: if the backend cannot run `config.strategy` or its input pipeline.
    """
    if keras.backend.backend() == "tensorflow":
        from .tensorflow_steps import TensorFlowSteps

        return TensorFlowSteps(config)
    return {"jax": JaxSteps, "torch": TorchSteps}[keras.backend.backend()](config)


def configure(config):
    """Process-wide settings; call before building anything: the dtype policy; where TensorFlow
    is installed, its logical CPU devices and determinism, and TensorFlow kept off the GPU
    where another backend runs the steps (it reads the images or writes TensorBoard's logs)."""
    keras.config.set_dtype_policy(precision.resolved(config, verbose=False).precision)
    backend = keras.backend.backend()
    if backend != "tensorflow" and not tensorflow_import.tensorflow_installed():
        return
    import tensorflow as tf

    if backend != "tensorflow":
        tf.config.set_visible_devices([], "GPU")
    if config.cpu_devices > 1 and backend == "tensorflow":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * config.cpu_devices)
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()
        # oneDNN's CPU kernels split their sums by thread, and Grappler rewrites a graph of
        # two replicas differently from a graph of one: one thread per kernel and no
        # rewrites make the arithmetic independent of how replicas are laid out over
        # devices, processes and cores (a multi-worker run then equals the one-process run).
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})


class OneDeviceSteps:
    """What the engines of Keras' JAX and PyTorch backends share: the config's check, the
    training model and its optimizer, the training batches as NumPy arrays from the config's
    input pipeline (this process's part of each, `shard`).

    Raises:
        ValueError: for a `config.strategy` the backend does not run (`strategies`).
    """

    chief = True
    backend = None  # Keras' name of the engine's backend
    strategies = ("default", "one_device")
    shard = (0, 1)

    def __init__(self, config):
        if config.strategy not in self.strategies:
            several = (
                "on several devices with --strategy data_parallel (keras.distribution)"
                if "data_parallel" in self.strategies
                else "on several devices under KERAS_BACKEND=jax (--strategy data_parallel) or tensorflow"
            )
            raise ValueError(
                f"Under KERAS_BACKEND={self.backend}, keras-preact train runs with strategy "
                f"{' or '.join(repr(name) for name in self.strategies)}. Received: strategy={config.strategy!r}. "
                f"Train {several}; mirrored, multi_worker and tpu are tf.distribute's, under KERAS_BACKEND=tensorflow."
            )
        self.config = config

    def training_objects(self, dataset, steps_per_epoch):
        """(training model, optimizer with its variables built, the loss of each example)."""
        config = self.config
        model = recipe.training_model(config, dataset.image_shape, len(dataset.class_names), seed=config.seed)
        optimizer = recipe.optimizer(config, steps_per_epoch, model)
        optimizer.build(model.trainable_variables)
        return model, optimizer, recipe.loss(config.label_smoothing, reduction=None)

    def start(self, split, steps_per_epoch, first_step, total_steps):
        self.batches = datasets.input_pipeline(self.config).training_arrays(
            split, self.config, steps_per_epoch, first_step, total_steps, self.shard
        )


class JaxSteps(OneDeviceSteps):
    """Training steps under JAX: one jitted function of the network's and the optimizer's
    values (Keras' stateless API: `Model.stateless_call`, `Optimizer.stateless_apply`), the
    same computation as `replica_step_function`'s with one replica. The values go back into
    Keras' variables for evaluation and for checkpoints (`synchronize`). On one device, or
    with `strategy="data_parallel"` on every device of every process
    (`keras_preact_training.train.data_parallel`): the same function on the global batch split
    across them.
    """

    backend = "jax"
    strategies = ("default", "one_device", "data_parallel")

    def __init__(self, config):
        super().__init__(config)
        self.parallel = data_parallel.DataParallel(config) if config.strategy == "data_parallel" else None
        if self.parallel is not None:
            self.chief, self.shard = self.parallel.chief, self.parallel.shard

    def build(self, dataset, steps_per_epoch):
        import jax
        import jax.numpy as jnp

        model, optimizer, per_example_loss = self.training_objects(dataset, steps_per_epoch)

        def loss_and_updates(trainable, non_trainable, optimizer_values, images, labels):
            logits, non_trainable, own_losses = model.stateless_call(
                trainable, non_trainable, images, training=True, return_losses=True
            )
            loss = jnp.mean(per_example_loss(labels, logits))
            total = loss + sum(own_losses) if own_losses else loss
            with keras.StatelessScope(state_mapping=list(zip(optimizer.variables, optimizer_values))):
                scaled = optimizer.scale_loss(total)
            return scaled, (loss, logits, non_trainable)

        gradients = jax.value_and_grad(loss_and_updates, has_aux=True)

        def train_step(state, images, labels):
            trainable, non_trainable, optimizer_values = state
            (_, (loss, logits, non_trainable)), grads = gradients(
                trainable, non_trainable, optimizer_values, images, labels
            )
            trainable, optimizer_values = optimizer.stateless_apply(optimizer_values, grads, trainable)
            correct = jnp.sum(jnp.argmax(logits, -1) == labels)
            return loss, correct, (trainable, non_trainable, optimizer_values)

        def predict(trainable, non_trainable, images):
            return model.stateless_call(trainable, non_trainable, images, training=False)[0]

        self.train_step, self.predict_values = jax.jit(train_step), jax.jit(predict)
        self.variables = model.trainable_variables, model.non_trainable_variables, optimizer.variables
        return model, optimizer

    def loaded(self):
        self.state = tuple([variable.value for variable in variables] for variables in self.variables)

    def step(self):
        images, labels = next(self.batches)
        if self.parallel is None:
            loss, correct, self.state = self.train_step(self.state, images, labels)
            return float(loss), float(correct)

        def parallel_step():
            loss, correct, self.state = self.train_step(self.state, *self.parallel.global_batch(images, labels))
            return float(loss), float(correct)

        return self.parallel.guarded(parallel_step)

    def synchronize(self):
        for variables, values in zip(self.variables, self.state):
            for variable, value in zip(variables, values):
                variable.assign(value)

    def predict(self, images):
        trainable, non_trainable = self.variables[:2]
        images = np.asarray(images) if self.parallel is None else self.parallel.replicated(images)
        return self.predict_values(
            [variable.value for variable in trainable], [variable.value for variable in non_trainable], images
        )


class TorchSteps(OneDeviceSteps):
    """Training steps under PyTorch on one device, as Keras' own PyTorch trainer takes them:
    the training model called eagerly, the loss's gradients by autograd (`backward`), the
    Keras optimizer's update without gradient tracking; Keras' variables hold the network
    throughout.
    """

    backend = "torch"

    def build(self, dataset, steps_per_epoch):
        self.model, self.optimizer, self.per_example_loss = self.training_objects(dataset, steps_per_epoch)
        return self.model, self.optimizer

    def loaded(self):
        """Nothing to do: the steps run on Keras' variables."""

    def step(self):
        import torch

        images, labels = next(self.batches)
        labels = keras.ops.convert_to_tensor(labels)
        logits = self.model(keras.ops.convert_to_tensor(images), training=True)
        loss = keras.ops.mean(self.per_example_loss(labels, logits))
        own_losses = self.model.losses
        total = loss + sum(own_losses) if own_losses else loss
        self.model.zero_grad()
        self.optimizer.scale_loss(total).backward()
        variables = self.model.trainable_variables
        with torch.no_grad():
            self.optimizer.apply([variable.value.grad for variable in variables], variables)
            correct = keras.ops.sum(keras.ops.cast(keras.ops.argmax(logits, -1) == labels, "float32"))
        return float(loss), float(correct)

    def synchronize(self):
        """Nothing to do: the steps run on Keras' variables."""

    def predict(self, images):
        import torch

        with torch.no_grad():
            return self.model(keras.ops.convert_to_tensor(np.asarray(images)), training=False)
