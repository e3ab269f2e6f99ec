"""The training loop of `keras-preact train`, on Keras' TensorFlow, JAX or PyTorch backend.

Each backend runs the steps through its engine (`keras_preact_training.train.engines`: `tf.distribute` on
TensorFlow, one device on JAX and PyTorch); everything else (data, evaluation, logs,
checkpoints, resuming) is one loop, `train`. Nothing here imports TensorFlow: under JAX or
PyTorch a run needs only NumPy and Pillow to read its images (`keras_preact_training.data.input_numpy`).
"""

import csv
import dataclasses
import hashlib
import json
import math
import os
import time

import keras
import numpy as np

from keras_preact import walks

from .. import files, plots
from ..data import datasets
from . import EVALUATION_BATCH_SIZE, checkpoints, configs, engines, precision, recipe

# test_* or validation_*: the split a run evaluates on (`Config.validation_examples`); hours: of
# training steps, summed over the sessions of a resumed run.
CSV_FIELDS = [
    "step",
    "epoch",
    "loss",
    "accuracy",
    "learning_rate",
    "test_loss",
    "test_error",
    "images_per_second",
    "validation_loss",
    "validation_error",
    "hours",
]
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
# evaluated and checkpointed (none of them changes a weight), which BatchNorm path runs
# (the same computation to float rounding, with the same variables in its checkpoints), and
# which input pipeline reads the images (the same batches).
RESUMABLE_CHANGES = (
    "data_dir",
    "evaluate_every",
    "checkpoint_every",
    "log_every",
    "fused_batch_norm",
    "input_pipeline",
)


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


def train(config, run_dir, verbose=True, command=None, allow_config_changes=False):
    """Trains `config` in `run_dir`, resuming from its last checkpoint; returns the summary
    (`command`, the command line that runs it, is recorded there).

    Under Keras' TensorFlow backend the steps run under the `tf.distribute` strategy of
    `config.strategy` (`engines.TensorFlowSteps`); under JAX and PyTorch, on one device
    (`engines.JaxSteps`, `engines.TorchSteps`). All write the same checkpoints
    (`keras_preact_training.train.checkpoints`), so a run started under one backend resumes under another.

    A run records its config in `run_dir/config.json` when it starts; a resumed run whose
    config differs from it in a field outside `RESUMABLE_CHANGES` is refused, unless
    `allow_config_changes` (the new config is then recorded).

    Raises:
        TrainingDiverged: if the loss becomes NaN or infinite (no checkpoint is written).
        ValueError: if the batch size does not divide over the replicas, if `run_dir`
            cannot be made, if the run resumed was started with other settings, or if the
            backend cannot run `config.strategy`.
    """
    config = precision.resolved(config, run_dir, verbose)
    keras.config.set_dtype_policy(config.precision)
    steps = engines.for_backend(config)
    if steps.chief:
        files.make_directory(run_dir, "run folder")
        check_resumed_config(config, run_dir, allow_config_changes, verbose)
    dataset = datasets.load(config)
    steps_per_epoch = configs.steps_per_epoch(dataset.train.size, config.batch_size)
    total_steps = config.total_steps(steps_per_epoch)
    keras.utils.set_random_seed(config.seed)
    model, optimizer = steps.build(dataset, steps_per_epoch)
    learning_rates = recipe.schedule(config, steps_per_epoch)

    # Every worker restores; the chief alone saves.
    checkpoint_dir = os.path.join(run_dir, "checkpoints")
    restored = checkpoints.restore_newest_intact(checkpoint_dir, model, optimizer, verbose=steps.chief and verbose)
    latest_checkpoint = restored
    steps.loaded()
    first_step = int(keras.ops.convert_to_numpy(optimizer.iterations))
    per_example_loss = recipe.loss(reduction=None)
    pipeline = datasets.input_pipeline(config)

    # A run with a validation split never reads the test set.
    evaluated_on = "test" if dataset.validation is None else "validation"
    evaluation_split = dataset.test if dataset.validation is None else dataset.validation

    def evaluate():
        """(loss, error) of the evaluated network: the weights' average in place of the trained
        weights where the config keeps one (`use_average`; the trained state is put back)."""
        steps.synchronize()
        trained = use_average() if config.average_momentum else []
        losses, correct, count = 0.0, 0, 0
        for images, labels in pipeline.evaluation_arrays(evaluation_split, EVALUATION_BATCH_SIZE):
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
        average_statistics(model, dataset.train, pipeline)
        return trained

    log = TrainingLog(run_dir, first_step, steps.chief)
    if first_step and steps.chief and verbose:
        print(f"Resuming from {restored} at step {first_step} of {total_steps}.")
    steps.start(dataset.train, steps_per_epoch, first_step, total_steps)
    progress = keras.utils.Progbar(
        total_steps,
        stateful_metrics=["loss", "accuracy", "lr", f"{evaluated_on}_error"],
        verbose=1 if steps.chief and verbose else 0,
    )
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
                f"({latest_checkpoint or 'none'}) is kept; lower the learning rate "
                f"(--set learning_rate=...) or check the data, then run the same command again."
            )
        window_loss, window_correct, window_steps = window_loss + loss, window_correct + correct, window_steps + 1
        values = [("loss", loss), ("accuracy", correct / config.batch_size), ("lr", learning_rate)]
        if step % config.log_every == 0 or step == total_steps:
            training_seconds += window_seconds
            row = dict(
                step=step,
                epoch=round(step / steps_per_epoch, 3),
                loss=window_loss / window_steps,
                accuracy=window_correct / (window_steps * config.batch_size),
                learning_rate=learning_rate,
                images_per_second=window_steps * config.batch_size / window_seconds,
                hours=round(log.earlier_hours + training_seconds / 3600, 5),
            )
            if step % config.evaluate_every == 0 or step == total_steps:
                row[f"{evaluated_on}_loss"], error = evaluate()
                row[f"{evaluated_on}_error"] = error
                values.append((f"{evaluated_on}_error", error))
            log.write(row)
            window_loss, window_correct, window_seconds, window_steps = 0.0, 0.0, 0.0, 0
        if step % config.checkpoint_every == 0 or step == total_steps:
            steps.synchronize()
            if steps.chief:
                latest_checkpoint = checkpoints.save(checkpoint_dir, step, checkpoints.state(model, optimizer))
        progress.update(step, values)

    if error is None:
        _, error = evaluate()
    steps.synchronize()
    if config.average_momentum:
        use_average()  # the evaluated network is the one saved
    summary = log.finish(config, dataset, model, evaluated_on, error, training_seconds, total_steps, command)
    if verbose and steps.chief:
        print(
            f"Final {evaluated_on} error {100 * error:.2f} % after {total_steps} steps; "
            f"{summary['training_images_per_second']:.0f} images/s this session; weights sha256 "
            f"{summary['weights_sha256'][:16]}; run in {run_dir}."
        )
    return summary


def average_statistics(
    model, split, pipeline=None, images=AVERAGE_STATISTICS_IMAGES, batch_size=AVERAGE_STATISTICS_BATCH
):
    """Sets the moving statistics of every BatchNorm of `model` to the mean of its batch
    statistics over `images` of `split` (a fixed random sample in a random order, so that
    every batch mixes the classes), in training mode: BatchNorm statistics of the weights
    `model` holds. Each call k (from 0) runs with momentum k / (k + 1), so the moving
    statistic after it is the mean of the k + 1 batches' (the unbiased variances, as in
    training). `pipeline` reads the split (`datasets.input_pipeline`; None: `input_numpy`, for
    splits of pixels or files)."""
    if pipeline is None:
        from ..data import input_numpy as pipeline
    norms = walks.batch_norms(model)
    momenta = [norm.momentum for norm in norms]
    try:
        sample = datasets.subset(split, images, seed=0, shuffled=True)
        for index, (batch, _) in enumerate(pipeline.evaluation_arrays(sample, batch_size)):
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
    checkpoint_dir = os.path.join(run_dir, "checkpoints")
    now = json.loads(json.dumps(dataclasses.asdict(config)))  # tuples as JSON lists, as recorded
    if os.path.exists(path) and os.path.isdir(checkpoint_dir) and os.listdir(checkpoint_dir):
        recorded = files.read_json(path, "move the run folder away to train from the start")
        # A field added to Config since the run started was its default then.
        defaults = json.loads(json.dumps(dataclasses.asdict(configs.Config())))
        recorded = {**{field: value for field, value in defaults.items() if field not in recorded}, **recorded}
        changed = [
            field
            for field in sorted(set(recorded) | set(now))
            if recorded.get(field) != now.get(field) and field not in RESUMABLE_CHANGES
        ]
        if changed and not allow_changes:
            differences = ", ".join(f"{field}: {recorded.get(field)!r} -> {now.get(field)!r}" for field in changed)
            raise ValueError(
                f"The run in {run_dir} was started with other settings; resuming it would train another "
                f"recipe. Differing fields: {differences}. Run the same command as it started with, "
                "choose another --run-dir, or resume with --allow-config-changes to train on with "
                "the new settings."
            )
        if changed and verbose:
            print(f"Resuming {run_dir} with changed settings (--allow-config-changes): {', '.join(changed)}.")
    with open(path, "w") as file:
        json.dump(now, file, indent=2)


def weights_digest(model):
    """SHA-256 of every weight's bytes: equal digests, bitwise equal networks."""
    digest = hashlib.sha256()
    for variable in model.weights:
        digest.update(np.ascontiguousarray(np.array(variable)).tobytes())
    return digest.hexdigest()


class TrainingLog:
    """The CSV log, TensorBoard summaries (where TensorFlow is installed), the plot and the
    summary of a run (chief only)."""

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
        self.writer = None
        if datasets.tensorflow_installed():
            import tensorflow as tf

            self.summary = tf.summary
            self.writer = tf.summary.create_file_writer(os.path.join(run_dir, "tensorboard"))

    def write(self, row):
        if not self.chief:
            return
        with open(self.csv_path, "a", newline="") as file:
            csv.DictWriter(file, CSV_FIELDS).writerow(row)
        if self.writer is None:
            return
        with self.writer.as_default(step=row["step"]):
            for name, value in row.items():
                if name not in ("step", "epoch"):
                    self.summary.scalar(name, value)
        self.writer.flush()

    def finish(self, config, dataset, model, evaluated_on, error, training_seconds, total_steps, command=None):
        """summary.json: `test_error` (or `validation_error`, with `evaluated_on` saying which) of the
        final model, `training_hours` of the whole run, this session's seconds and images/s."""
        summary = dict(
            evaluated_on=evaluated_on,
            **{f"{evaluated_on}_error": error},
            steps=total_steps,
            training_hours=round(self.earlier_hours + training_seconds / 3600, 4),
            training_seconds=round(training_seconds, 2),
            training_images_per_second=self.images_per_second(),
            weights_sha256=weights_digest(model),
            model=config.model,
            dataset=config.dataset,
            class_names=dataset.class_names,
            image_shape=list(dataset.image_shape),
            config=dataclasses.asdict(config),
            command=command,
        )
        if not self.chief:
            return summary
        plots.training_curves(
            self.csv_path, os.path.join(self.run_dir, "curves.png"), title=f"{config.model} on {datasets.name(config)}"
        )
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
