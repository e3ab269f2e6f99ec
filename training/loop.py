"""The training loop of `keras-preact train`, on Keras' TensorFlow or JAX backend.

Keras 3's `model.fit` fails under `MultiWorkerMirroredStrategy` (keras-team/keras#20585);
a step of our own, `strategy.run` over the recipe's model, optimizer and loss, runs the
same on one device, several local devices and several machines (`TensorFlowSteps`).
Under JAX the same step is one jitted function on one device (`JaxSteps`). Everything
else (data, evaluation, logs, checkpoints, resuming) is one loop, `train`.
"""

import csv
import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf

from keras_preact import stacked
from . import configs, data, files, plots, recipe

# test_* or validation_*: the split a run evaluates on (`Config.validation_examples`); hours: of
# training steps, summed over the sessions of a resumed run.
CSV_FIELDS = ["step", "epoch", "loss", "accuracy", "learning_rate", "test_loss", "test_error", "images_per_second",
              "validation_loss", "validation_error", "hours"]
# Evaluation batch size: a memory bound only; results do not depend on it.
EVALUATION_BATCH = 500
# The weights' average (`Config.average_momentum`) is evaluated with BatchNorm statistics
# of its own, the mean of those of this many training images in batches of
# AVERAGE_STATISTICS_BATCH (Izmailov et al., "Averaging Weights Leads to Wider Optima",
# 2018, section 3.2): with the trained network's statistics, the average of a ResNet-20
# at 15 epochs erred on 35.9 % of the validation images, with its own on 16.8 % (the
# trained network: 16.5 %).
AVERAGE_STATISTICS_IMAGES = 4096
AVERAGE_STATISTICS_BATCH = 256
# The run's config as it started, beside its checkpoints: a resumed run must have the same.
CONFIG_FILE = "config.json"
# Fields a resumed run may change: where the data is read from, how often it is logged,
# evaluated and checkpointed (none of them changes a weight), and which BatchNorm path runs
# (the same computation to float rounding, with the same variables in its checkpoints).
RESUMABLE_CHANGES = ("data_dir", "evaluate_every", "checkpoint_every", "log_every", "fused_batch_norm")


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


class CheckpointsUnreadable(RuntimeError):
    """A run directory holds checkpoints and none of them can be restored."""


def configure(config):
    """Process-wide settings; call before building anything."""
    if config.cpu_devices > 1:
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
    if keras.backend.backend() == "jax":
        tf.config.set_visible_devices([], "GPU")  # TensorFlow only reads the images: the GPU is JAX's
    keras.config.set_dtype_policy(config.precision)


def make_strategy(config):
    """The `tf.distribute` strategy named by `config.strategy`."""
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


def batch_norm_layers(model):
    """Every BatchNormalization layer of `model`, the units' included, stacked ones too."""
    return [layer for layer in stacked.all_layers(model) if isinstance(layer, keras.layers.BatchNormalization)]


def synchronize_batch_norm(model):
    """BatchNorm statistics over all replicas instead of per replica (read at call time)."""
    for layer in batch_norm_layers(model):
        layer.synchronized = True


def replica_step_function(model, optimizer, global_batch_size, per_example_loss, xla=False):
    """One replica's training step, `(images, labels) -> (mean loss, correct answers)`:
    the loss averaged over the global batch, the model's own losses (if any: the recipe's
    optimizer takes the weight decay over, `recipe.CoupledSGD`), gradients, update.

    Run it under `strategy.run` inside a `tf.function`; `xla` compiles the gradient
    computation (XLA cannot compile the optimizer's cross-replica update).
    """

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


def train(config, run_dir, verbose=True, command=None, allow_config_changes=False):
    """Trains `config` in `run_dir`, resuming from its last checkpoint; returns the summary
    (`command`, the command line that runs it, is recorded there).

    Under Keras' TensorFlow backend the steps run under the `tf.distribute` strategy of
    `config.strategy` (`TensorFlowSteps`); under JAX, on one device (`JaxSteps`). Both write
    the same checkpoints, so a run started under one backend resumes under the other.

    A run records its config in `run_dir/config.json` when it starts; a resumed run whose
    config differs from it in a field outside `RESUMABLE_CHANGES` is refused, unless
    `allow_config_changes` (the new config is then recorded).

    Raises:
        TrainingDiverged: if the loss becomes NaN or infinite (no checkpoint is written).
        ValueError: if the batch size does not divide over the replicas, if `run_dir`
            cannot be made, if the run resumed was started with other settings, or if the
            backend cannot run `config.strategy`.
    """
    steps = JaxSteps(config) if keras.backend.backend() == "jax" else TensorFlowSteps(config)
    if steps.chief:
        files.make_directory(run_dir, "run folder")
        check_resumed_config(config, run_dir, allow_config_changes, verbose)
    dataset = data.load(config)
    steps_per_epoch = configs.steps_per_epoch(dataset.train.size, config.batch_size)
    total_steps = config.total_steps(steps_per_epoch)
    keras.utils.set_random_seed(config.seed)
    model, optimizer = steps.build(dataset, steps_per_epoch)
    learning_rates = recipe.schedule(config, steps_per_epoch)

    # Every worker saves (saving is collective); only the chief's copy is kept.
    checkpoint_dir = os.path.join(run_dir, "checkpoints") if steps.chief else tempfile.mkdtemp()
    manager = tf.train.CheckpointManager(steps.checkpoint, checkpoint_dir, max_to_keep=3)
    restored = restore_newest_intact(steps.checkpoint, checkpoint_dir, verbose=steps.chief and verbose)
    steps.restored()
    first_step = int(keras.ops.convert_to_numpy(optimizer.iterations))
    per_example_loss = recipe.loss(reduction=None)

    # A run with a validation split never reads the test set.
    evaluated_on = "test" if dataset.validation is None else "validation"
    evaluation_split = dataset.test if dataset.validation is None else dataset.validation

    def evaluate():
        """(loss, error) of the evaluated network: the weights' average in place of the trained
        weights where the config keeps one (`use_average`; the trained state is put back)."""
        steps.synchronize()
        trained = use_average() if config.average_momentum else []
        losses, correct, count = 0.0, 0, 0
        for images, labels in data.evaluation_batches(evaluation_split, EVALUATION_BATCH):
            logits = keras.ops.cast(steps.predict(images), "float32")
            labels = np.asarray(labels)
            losses += float(keras.ops.sum(per_example_loss(labels, logits)))
            correct += int(np.sum(np.argmax(keras.ops.convert_to_numpy(logits), -1) == labels))
            count += len(labels)
        for variable, value in zip(model.variables, trained):
            variable.assign(value)
        return losses / count, 1.0 - correct / count

    def use_average():
        """Puts the weights' average in the network with BatchNorm statistics of its own
        (`average_statistics`); returns the values of every variable before, to put back."""
        trained = [np.array(variable) for variable in model.variables]
        optimizer.finalize_variable_values(model.trainable_variables)
        average_statistics(model, dataset.train)
        return trained

    log = TrainingLog(run_dir, first_step, steps.chief)
    if first_step and steps.chief and verbose:
        print(f"Resuming from {restored} at step {first_step} of {total_steps}.")
    steps.start(dataset.train, steps_per_epoch, first_step, total_steps)
    progress = keras.utils.Progbar(total_steps, stateful_metrics=["loss", "accuracy", "lr", f"{evaluated_on}_error"],
                                   verbose=1 if steps.chief and verbose else 0)
    progress.update(first_step)
    # Training time counts the steps only (until their loss is back), not evaluations or checkpoints.
    window_loss, window_correct, window_seconds, window_steps = 0.0, 0.0, 0.0, 0
    training_seconds, error = 0.0, None
    for step in range(first_step + 1, total_steps + 1):
        learning_rate = float(learning_rates(step - 1))  # the rate of this step: the schedule counts from 0
        started = time.perf_counter()
        loss, correct = steps.step()
        window_seconds += time.perf_counter() - started
        if not math.isfinite(loss):
            raise TrainingDiverged(
                f"Training stopped at step {step}: the loss is {loss}. The last checkpoint "
                f"({manager.latest_checkpoint or 'none'}) is kept; lower the learning rate "
                f"(--set learning_rate=...) or check the data, then run the same command again."
            )
        window_loss, window_correct, window_steps = window_loss + loss, window_correct + correct, window_steps + 1
        values = [("loss", loss), ("accuracy", correct / config.batch_size), ("lr", learning_rate)]
        if step % config.log_every == 0 or step == total_steps:
            training_seconds += window_seconds
            row = dict(step=step, epoch=round(step / steps_per_epoch, 3), loss=window_loss / window_steps,
                       accuracy=window_correct / (window_steps * config.batch_size), learning_rate=learning_rate,
                       images_per_second=window_steps * config.batch_size / window_seconds,
                       hours=round(log.earlier_hours + training_seconds / 3600, 5))
            if step % config.evaluate_every == 0 or step == total_steps:
                row[f"{evaluated_on}_loss"], error = evaluate()
                row[f"{evaluated_on}_error"] = error
                values.append((f"{evaluated_on}_error", error))
            log.write(row)
            window_loss, window_correct, window_seconds, window_steps = 0.0, 0.0, 0.0, 0
        if step % config.checkpoint_every == 0 or step == total_steps:
            steps.synchronize()
            steps.saving()
            manager.save(checkpoint_number=step)
        progress.update(step, values)

    if not steps.chief:
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    if error is None:
        _, error = evaluate()
    steps.synchronize()
    if config.average_momentum:
        use_average()  # the evaluated network is the one saved
    summary = log.finish(config, dataset, model, evaluated_on, error, training_seconds, total_steps, command)
    if verbose:
        print(
            f"Final {evaluated_on} error {100 * error:.2f} % after {total_steps} steps; "
            f"{summary['training_images_per_second']:.0f} images/s this session; weights sha256 "
            f"{summary['weights_sha256'][:16]}; run in {run_dir}."
        )
    return summary


class TensorFlowSteps:
    """Training steps under the `tf.distribute` strategy of `config.strategy`: the model and
    the optimizer built in its scope, one `strategy.run` of `replica_step_function` a step,
    Keras' variables holding the network throughout.

    Raises:
        ValueError: if the batch size does not divide over the strategy's replicas.
    """

    def __init__(self, config):
        self.config = config
        self.strategy = make_strategy(config)
        self.replicas = self.strategy.num_replicas_in_sync
        if config.batch_size % self.replicas:
            raise ValueError(f"batch_size must be divisible by the number of replicas ({self.replicas}). "
                             f"Received: batch_size={config.batch_size}")
        self.chief = is_chief(self.strategy)

    def build(self, dataset, steps_per_epoch):
        """The training model and its optimizer; sets `checkpoint`, their variables by name."""
        config, strategy = self.config, self.strategy
        with strategy.scope():
            model = recipe.training_model(config, dataset.image_shape, len(dataset.class_names), seed=config.seed)
            if config.synchronized_batch_norm:
                synchronize_batch_norm(model)
            optimizer = recipe.optimizer(config, steps_per_epoch, model)
            optimizer.build(model.trainable_variables)
            self.checkpoint = training_state(model, optimizer)
        replica_step = replica_step_function(model, optimizer, config.batch_size,
                                             recipe.loss(config.label_smoothing, reduction=None), config.xla)

        @tf.function
        def train_step(iterator):
            loss, correct = strategy.run(replica_step, args=next(iterator))
            return strategy.reduce("SUM", loss, axis=None), strategy.reduce("SUM", correct, axis=None)

        moving_statistics = stacked.moving_statistics(model)

        @tf.function
        def average_moving_statistics():
            local_values = strategy.run(lambda: [tf.identity(variable) for variable in moving_statistics])
            for variable, values in zip(moving_statistics, local_values):
                variable.assign(strategy.reduce("MEAN", values, axis=None))

        self.train_step, self.average_moving_statistics = train_step, average_moving_statistics
        self.predict = tf.function(lambda images: model(images, training=False))
        return model, optimizer

    def restored(self):
        """After the checkpoint is restored (or not): nothing to do, it restores Keras' variables."""

    def start(self, split, steps_per_epoch, first_step, total_steps):
        """Begins reading the training batches of steps first_step + 1 .. total_steps."""
        self.iterator = iter(self.strategy.distribute_datasets_from_function(
            lambda context: data.training_batches(split, self.config, steps_per_epoch, first_step, total_steps, context)
        ))

    def step(self):
        """One training step: (loss, correct answers) of its batch."""
        loss, correct = self.train_step(self.iterator)
        return float(loss), float(correct)

    def synchronize(self):
        """Per-replica BatchNorm keeps per-replica moving averages: averages them, so that every
        replica and worker evaluates and saves the same network."""
        if self.replicas > 1:
            self.average_moving_statistics()

    def saving(self):
        """Before a checkpoint: nothing to do, it saves Keras' variables."""


class JaxSteps:
    """Training steps under JAX on one device: one jitted function of the network's and the
    optimizer's values (Keras' stateless API: `Model.stateless_call`, `Optimizer.stateless_apply`),
    the same computation as `replica_step_function`'s with one replica. The values go back into
    Keras' variables for evaluation and for checkpoints: `training_state`'s, the variables by
    name in TensorFlow's format, written and read through TensorFlow copies of them (`saving`,
    `restored`).

    Raises:
        ValueError: if `config.strategy` needs `tf.distribute` (mirrored, multi_worker, tpu).
    """

    chief = True
    # Integers are 64-bit in a checkpoint, as TensorFlow keeps them, so that either backend
    # resumes a run of the other: JAX (without x64) keeps the optimizer's step count as int32
    # and Keras' seed generators their state as uint32.
    CHECKPOINT_DTYPES = {"int32": "int64", "uint32": "int64"}

    def __init__(self, config):
        if config.strategy not in ("default", "one_device"):
            raise ValueError(
                "Under KERAS_BACKEND=jax, keras-preact train runs on one device (strategy 'default' or "
                f"'one_device'). Received: strategy={config.strategy!r}. Train on several devices under "
                "Keras' TensorFlow backend (tf.distribute), or on one.")
        self.config = config

    def build(self, dataset, steps_per_epoch):
        import jax
        import jax.numpy as jnp

        config = self.config
        model = recipe.training_model(config, dataset.image_shape, len(dataset.class_names), seed=config.seed)
        optimizer = recipe.optimizer(config, steps_per_epoch, model)
        optimizer.build(model.trainable_variables)
        per_example_loss = recipe.loss(config.label_smoothing, reduction=None)

        def loss_and_updates(trainable, non_trainable, optimizer_values, images, labels):
            logits, non_trainable, own_losses = model.stateless_call(
                trainable, non_trainable, images, training=True, return_losses=True)
            loss = jnp.mean(per_example_loss(labels, logits))
            total = loss + sum(own_losses) if own_losses else loss
            with keras.StatelessScope(state_mapping=list(zip(optimizer.variables, optimizer_values))):
                scaled = optimizer.scale_loss(total)
            return scaled, (loss, logits, non_trainable)

        gradients = jax.value_and_grad(loss_and_updates, has_aux=True)

        def train_step(state, images, labels):
            trainable, non_trainable, optimizer_values = state
            (_, (loss, logits, non_trainable)), grads = gradients(trainable, non_trainable, optimizer_values,
                                                                  images, labels)
            trainable, optimizer_values = optimizer.stateless_apply(optimizer_values, grads, trainable)
            correct = jnp.sum(jnp.argmax(logits, -1) == labels)
            return loss, correct, (trainable, non_trainable, optimizer_values)

        def predict(trainable, non_trainable, images):
            return model.stateless_call(trainable, non_trainable, images, training=False)[0]

        self.train_step, self.predict_values = jax.jit(train_step), jax.jit(predict)
        self.variables = model.trainable_variables, model.non_trainable_variables, optimizer.variables
        keyed = {"model": _by_name(model.variables), "optimizer": _by_name(optimizer.variables)}
        self.copies = {part: {key: tf.Variable(self._to_checkpoint(value), trainable=False)
                              for key, value in values.items()} for part, values in keyed.items()}
        self.originals = {part: dict(zip(self.copies[part], variables))
                          for part, variables in (("model", model.variables), ("optimizer", optimizer.variables))}
        self.checkpoint = tf.train.Checkpoint(**self.copies)
        return model, optimizer

    def _to_checkpoint(self, value):
        value = np.asarray(value)
        return value.astype(self.CHECKPOINT_DTYPES.get(value.dtype.name, value.dtype))

    def restored(self):
        """Puts the restored copies into Keras' variables and takes the state of the steps from them."""
        for part, copies in self.copies.items():
            for key, copy in copies.items():
                original = self.originals[part][key]
                original.assign(copy.numpy().astype(original.dtype))
        self.state = tuple([variable.value for variable in variables] for variables in self.variables)

    def saving(self):
        """Before a checkpoint: copies Keras' variables (`synchronize`d) into the checkpoint's."""
        for part, copies in self.copies.items():
            for key, copy in copies.items():
                copy.assign(self._to_checkpoint(self.originals[part][key].value))

    def start(self, split, steps_per_epoch, first_step, total_steps):
        """Begins reading the training batches of steps first_step + 1 .. total_steps, as arrays."""
        self.batches = data.training_batches(split, self.config, steps_per_epoch, first_step,
                                             total_steps).as_numpy_iterator()

    def step(self):
        """One training step: (loss, correct answers) of its batch."""
        images, labels = next(self.batches)
        loss, correct, self.state = self.train_step(self.state, images, labels)
        return float(loss), float(correct)

    def synchronize(self):
        """Puts the steps' state into Keras' variables: the network evaluated, averaged or saved."""
        for variables, values in zip(self.variables, self.state):
            for variable, value in zip(variables, values):
                variable.assign(value)

    def predict(self, images):
        """Logits of the network in Keras' variables (`synchronize`d, or the weights' average)."""
        trainable, non_trainable = self.variables[:2]
        return self.predict_values([variable.value for variable in trainable],
                                   [variable.value for variable in non_trainable], np.asarray(images))


def average_statistics(model, split, images=AVERAGE_STATISTICS_IMAGES, batch_size=AVERAGE_STATISTICS_BATCH):
    """Sets the moving statistics of every BatchNorm of `model` to the mean of its batch
    statistics over `images` of `split` (a fixed random sample in a random order, so that
    every batch mixes the classes), in training mode: BatchNorm statistics of the weights
    `model` holds. Each call k (from 0) runs with momentum k / (k + 1), so the moving
    statistic after it is the mean of the k + 1 batches' (the unbiased variances, as in
    training)."""
    norms = [layer for layer in stacked.all_layers(model) if isinstance(layer, keras.layers.BatchNormalization)]
    momenta = [norm.momentum for norm in norms]
    try:
        sample = data.subset(split, images, seed=0, shuffled=True)
        for index, (batch, _) in enumerate(data.evaluation_batches(sample, batch_size)):
            for norm in norms:
                norm.momentum = index / (index + 1)
            model(batch, training=True)  # eagerly: each call reads the momentum it is given
    finally:
        for norm, momentum in zip(norms, momenta):
            norm.momentum = momentum


def check_resumed_config(config, run_dir, allow_changes=False, verbose=True):
    """Records `config` in `run_dir/config.json` for a new run; for a resumed one, compares
    it with the recorded config.

    Raises:
        ValueError: naming each differing field (recorded -> now), where one outside
            `RESUMABLE_CHANGES` differs and not `allow_changes`.
    """
    path = os.path.join(run_dir, CONFIG_FILE)
    checkpoints = os.path.join(run_dir, "checkpoints")
    now = json.loads(json.dumps(dataclasses.asdict(config)))  # tuples as JSON lists, as recorded
    if os.path.exists(path) and os.path.isdir(checkpoints) and os.listdir(checkpoints):
        recorded = files.read_json(path, "move the run folder away to train from the start")
        # A field added to Config since the run started was its default then.
        defaults = json.loads(json.dumps(dataclasses.asdict(configs.Config())))
        recorded = {**{field: value for field, value in defaults.items() if field not in recorded}, **recorded}
        changed = [field for field in sorted(set(recorded) | set(now))
                   if recorded.get(field) != now.get(field) and field not in RESUMABLE_CHANGES]
        if changed and not allow_changes:
            differences = ", ".join(f"{field}: {recorded.get(field)!r} -> {now.get(field)!r}" for field in changed)
            raise ValueError(f"The run in {run_dir} was started with other settings; resuming it would train another "
                             f"recipe. Differing fields: {differences}. Run the same command as it started with, "
                             "choose another --run-dir, or resume with --allow-config-changes to train on with "
                             "the new settings.")
        if changed and verbose:
            print(f"Resuming {run_dir} with changed settings (--allow-config-changes): {', '.join(changed)}.")
    with open(path, "w") as file:
        json.dump(now, file, indent=2)


def restore_newest_intact(checkpoint, checkpoint_dir, verbose=True):
    """Restores the newest checkpoint of `checkpoint_dir` that reads back whole; returns its
    path, or None where there is none (a new run).

    The checkpoints are found from their files (`ckpt-<step>.index`), not from the
    `checkpoint` index file, which a crash or a careless edit can leave wrong. A truncated
    or deleted newest checkpoint is skipped with a message, and the one before it is used:
    the steps since are trained again, nothing else is lost.

    Raises:
        CheckpointsUnreadable: if there are checkpoints and none of them can be restored.
    """
    steps = sorted((int(match.group(1)) for match in (re.fullmatch(r"ckpt-(\d+)\.index", name)
                                                       for name in (os.listdir(checkpoint_dir)
                                                                    if os.path.isdir(checkpoint_dir) else []))
                    if match), reverse=True)
    failures = []
    for step in steps:
        path = os.path.join(checkpoint_dir, f"ckpt-{step}")
        try:
            checkpoint.restore(path).assert_consumed()
        except Exception as error:  # noqa: BLE001  (TensorFlow reports a damaged file as OpError, IndexError, ...)
            failures.append(f"{path}: {str(error).splitlines()[0][:200]}")
            if verbose:
                print(f"Checkpoint {path} cannot be restored ({failures[-1]}); trying the one before it.")
            continue
        return path
    if failures:
        raise CheckpointsUnreadable(
            f"No checkpoint in {checkpoint_dir} can be restored (truncated or corrupt files): "
            + "; ".join(failures) + ". Move the run directory away to train from the start."
        )
    return None


def weights_digest(model):
    """SHA-256 of every weight's bytes: equal digests, bitwise equal networks."""
    digest = hashlib.sha256()
    for variable in model.weights:
        digest.update(np.ascontiguousarray(np.array(variable)).tobytes())
    return digest.hexdigest()


def training_state(model, optimizer):
    """A checkpoint of every variable of the model and the optimizer, by name.

    `model.variables`, not `model.weights`: the augmentation's random state is a
    variable but not a weight, and a resumed run must draw the same crops and flips.
    With BatchNorm's moving statistics and every optimizer variable (step count,
    momentum). TF's object-graph tracking of a Keras 3 model misses sublayers kept in
    lists (the units' convolutions and BatchNorms), so the variables are listed here.
    """
    return tf.train.Checkpoint(model=_by_name(model.variables), optimizer=_by_name(optimizer.variables))


def _by_name(variables):
    # Paths need not be unique (every seed generator's is "seed_generator/..."): number them.
    return {f"{index}:{variable.path.replace('/', '.')}": variable.value for index, variable in enumerate(variables)}


class TrainingLog:
    """The CSV log, TensorBoard summaries, the plot and the summary of a run (chief only)."""

    def __init__(self, run_dir, first_step, chief):
        self.run_dir, self.chief = run_dir, chief
        self.csv_path = os.path.join(run_dir, "log.csv")
        self.earlier_hours = 0.0
        if not chief:
            return
        os.makedirs(run_dir, exist_ok=True)
        rows = []
        if os.path.exists(self.csv_path):
            with open(self.csv_path) as file:
                # A resumed run drops what was logged after its checkpoint.
                rows = [row for row in csv.DictReader(file) if int(row["step"]) <= first_step]
            self.earlier_hours = max([float(row.get("hours") or 0) for row in rows], default=0.0)
        with open(self.csv_path, "w", newline="") as file:
            writer = csv.DictWriter(file, CSV_FIELDS)
            writer.writeheader()
            writer.writerows(rows)
        self.writer = tf.summary.create_file_writer(os.path.join(run_dir, "tensorboard"))

    def write(self, row):
        if not self.chief:
            return
        with open(self.csv_path, "a", newline="") as file:
            csv.DictWriter(file, CSV_FIELDS).writerow(row)
        with self.writer.as_default(step=row["step"]):
            for name, value in row.items():
                if name not in ("step", "epoch"):
                    tf.summary.scalar(name, value)
        self.writer.flush()

    def finish(self, config, dataset, model, evaluated_on, error, training_seconds, total_steps, command=None):
        """summary.json: `test_error` (or `validation_error`, with `evaluated_on` saying which) of the
        final model, `training_hours` of the whole run, this session's seconds and images/s."""
        summary = dict(
            evaluated_on=evaluated_on, **{f"{evaluated_on}_error": error}, steps=total_steps,
            training_hours=round(self.earlier_hours + training_seconds / 3600, 4),
            training_seconds=round(training_seconds, 2),
            training_images_per_second=self.images_per_second(),
            weights_sha256=weights_digest(model),
            model=config.model, dataset=config.dataset, class_names=dataset.class_names,
            image_shape=list(dataset.image_shape), config=dataclasses.asdict(config), command=command,
        )
        if not self.chief:
            return summary
        plots.training_curves(self.csv_path, os.path.join(self.run_dir, "curves.png"),
                              title=f"{config.model} on {data.name(config)}")
        model.save(os.path.join(self.run_dir, "model.keras"))
        with open(os.path.join(self.run_dir, "summary.json"), "w") as file:
            json.dump(summary, file, indent=2)
        return summary

    def images_per_second(self):
        if not self.chief:
            return float("nan")
        with open(self.csv_path) as file:
            rates = [float(row["images_per_second"]) for row in csv.DictReader(file) if row["images_per_second"]]
        return float(np.median(rates)) if rates else float("nan")
