"""The step engine of Keras' TensorFlow backend: `TensorFlowSteps`, under a `tf.distribute`
strategy. Keras 3's `model.fit` fails under `MultiWorkerMirroredStrategy`
(keras-team/keras#20585); a step of our own, `strategy.run` over the recipe's model, optimizer
and loss, runs the same on one device, several local devices and several machines."""

from keras_preact import walks

from . import configs, recipe


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
