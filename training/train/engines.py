"""The step engines of `keras-preact train`: how one backend builds the training model and runs
its steps, behind the one interface the loop (`keras_preact_training.train.loop.train`) uses, `StepEngine`.

- `TensorFlowSteps`: Keras' TensorFlow backend under a `tf.distribute` strategy. Keras 3's
  `model.fit` fails under `MultiWorkerMirroredStrategy` (keras-team/keras#20585); a step of
  our own, `strategy.run` over the recipe's model, optimizer and loss, runs the same on one
  device, several local devices and several machines.
- `JaxSteps`: one jitted function of the network's and the optimizer's values on one device.
- `TorchSteps`: PyTorch's autograd and the Keras optimizer on one device.

All three compute the same step (the recipe's loss averaged over the batch, the network's own
losses, the recipe's optimizer) and keep the network in Keras' variables between steps
(after `synchronize`), which the checkpoints (`keras_preact_training.train.checkpoints`) save and restore.
Only `TensorFlowSteps` needs TensorFlow; `configure` sets it up where it is installed.
"""

import typing

import keras
import numpy as np

from keras_preact import walks

from ..data import datasets
from . import configs, data_parallel, precision, recipe


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
    engines = {"tensorflow": TensorFlowSteps, "jax": JaxSteps, "torch": TorchSteps}
    return engines[keras.backend.backend()](config)


def configure(config):
    """Process-wide settings; call before building anything: the dtype policy; where TensorFlow
    is installed, its logical CPU devices and determinism, and TensorFlow kept off the GPU
    where another backend runs the steps (it reads the images or writes TensorBoard's logs)."""
    keras.config.set_dtype_policy(precision.resolved(config, verbose=False).precision)
    backend = keras.backend.backend()
    if backend != "tensorflow" and not datasets.tensorflow_installed():
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


def make_strategy(config):
    """The `tf.distribute` strategy named by `config.strategy`."""
    import tensorflow as tf

    if config.strategy == "default":
        return tf.distribute.get_strategy()
    if config.strategy == "one_device":
        gpus = tf.config.list_logical_devices("GPU")
        return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")
    if config.strategy == "mirrored":
        devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
        return tf.distribute.MirroredStrategy([device.name for device in devices])
    if config.strategy == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def is_chief(strategy):
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True
    return resolver.task_type == "chief" or (resolver.task_type == "worker" and resolver.task_id == 0)


def synchronize_batch_norm(model):
    """BatchNorm statistics over all replicas instead of per replica (read at call time)."""
    for layer in walks.batch_norms(model):
        layer.synchronized = True


def replica_step_function(model, optimizer, global_batch_size, per_example_loss, xla=False):
    """One replica's training step, `(images, labels) -> (mean loss, correct answers)`:
    the loss averaged over the global batch, the model's own losses (if any: the recipe's
    optimizer takes the weight decay over, `recipe.CoupledSGD`), gradients, update.

    Run it under `strategy.run` inside a `tf.function`; `xla` compiles the gradient
    computation (XLA cannot compile the optimizer's cross-replica update).
    """
    import tensorflow as tf

    def gradients(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = tf.nn.compute_average_loss(per_example_loss(labels, logits), global_batch_size=global_batch_size)
            own_losses = model.losses
            total = loss + tf.nn.scale_regularization_loss(tf.add_n(own_losses)) if own_losses else loss
            scaled = optimizer.scale_loss(total)
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1), labels), tf.float32))
        return tape.gradient(scaled, model.trainable_variables), loss, correct

    if xla:
        gradients = tf.function(gradients, jit_compile=True)

    def replica_step(images, labels):
        grads, loss, correct = gradients(images, labels)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss, correct

    return replica_step


class TensorFlowSteps:
    """Training steps under the `tf.distribute` strategy of `config.strategy`: the model and
    the optimizer built in its scope, one `strategy.run` of `replica_step_function` a step,
    Keras' variables holding the network throughout.

    Raises:
        ValueError: if the batch size does not divide over the strategy's replicas, or the
            config asks for the NumPy input pipeline (tf.distribute reads through tf.data).
    """

    def __init__(self, config):
        if config.input_pipeline == "numpy":
            raise ValueError(
                "Under KERAS_BACKEND=tensorflow the images are read through tf.data (tf.distribute). "
                "Received: input_pipeline='numpy'. Leave input_pipeline unset, or train under "
                "KERAS_BACKEND=jax or torch."
            )
        if config.strategy not in configs.TENSORFLOW_STRATEGIES:
            raise ValueError(
                "--strategy data_parallel is Keras' data parallelism under KERAS_BACKEND=jax. Received: "
                f"strategy={config.strategy!r} under KERAS_BACKEND=tensorflow, whose strategies are tf.distribute's: "
                "mirrored (the devices of a machine) or multi_worker (several machines)."
            )
        self.config = config
        self.strategy = make_strategy(config)
        self.replicas = self.strategy.num_replicas_in_sync
        if config.batch_size % self.replicas:
            raise ValueError(
                f"batch_size must be divisible by the number of replicas ({self.replicas}). "
                f"Received: batch_size={config.batch_size}"
            )
        self.chief = is_chief(self.strategy)

    def build(self, dataset, steps_per_epoch):
        import tensorflow as tf

        config, strategy = self.config, self.strategy
        with strategy.scope():
            model = recipe.training_model(config, dataset.image_shape, len(dataset.class_names), seed=config.seed)
            if config.synchronized_batch_norm:
                synchronize_batch_norm(model)
            optimizer = recipe.optimizer(config, steps_per_epoch, model)
            optimizer.build(model.trainable_variables)
        replica_step = replica_step_function(
            model, optimizer, config.batch_size, recipe.loss(config.label_smoothing, reduction=None), config.xla
        )

        @tf.function
        def train_step(iterator):
            loss, correct = strategy.run(replica_step, args=next(iterator))
            return strategy.reduce("SUM", loss, axis=None), strategy.reduce("SUM", correct, axis=None)

        moving_statistics = walks.moving_statistics(model)

        @tf.function
        def average_moving_statistics():
            local_values = strategy.run(lambda: [tf.identity(variable) for variable in moving_statistics])
            for variable, values in zip(moving_statistics, local_values):
                variable.assign(strategy.reduce("MEAN", values, axis=None))

        self.train_step, self.average_moving_statistics = train_step, average_moving_statistics
        self.predict_function = tf.function(lambda images: model(images, training=False))
        return model, optimizer

    def loaded(self):
        """Nothing to do: the steps run on Keras' variables."""

    def start(self, split, steps_per_epoch, first_step, total_steps):
        from ..data import input_tensorflow

        self.iterator = iter(
            self.strategy.distribute_datasets_from_function(
                lambda context: input_tensorflow.training_batches(
                    split, self.config, steps_per_epoch, first_step, total_steps, context
                )
            )
        )

    def step(self):
        loss, correct = self.train_step(self.iterator)
        return float(loss), float(correct)

    def synchronize(self):
        """Per-replica BatchNorm keeps per-replica moving averages: averages them, so that every
        replica and worker evaluates and saves the same network."""
        if self.replicas > 1:
            self.average_moving_statistics()

    def predict(self, images):
        return self.predict_function(images)


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
