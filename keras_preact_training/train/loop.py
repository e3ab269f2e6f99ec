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

from .. import checked_files, plots, tensorflow_import
from ..data import datasets
from ..failures import TrainingDiverged
from . import EVALUATION_BATCH_SIZE, averaging, checkpoints, configs, engines, precision, recipe

# test_* or validation_*: the split a run evaluates on (`Config.validation_examples`), average_*
# the weights' moving average there (`Config.average_momentum`), swa_* their equal average
# (`Config.swa_start`); hours: of training steps, summed over the sessions of a resumed run.
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
    "average_test_loss",
    "average_test_error",
    "average_validation_loss",
    "average_validation_error",
    "swa_test_loss",
    "swa_test_error",
    "swa_validation_loss",
    "swa_validation_error",
    "hours",
]
# The weights' averages (`Config.average_momentum`, `Config.swa_start`) are evaluated with BatchNorm statistics
# of its own, the mean of those of this many training images in batches of
# AVERAGE_STATISTICS_BATCH (Izmailov et al., "Averaging Weights Leads to Wider Optima",
# 2018, section 3.2): with the trained network's statistics an average errs several times
# more (docs/zoo.md, "The weights' average needs BatchNorm statistics of its own").
AVERAGE_STATISTICS_IMAGES = 4096
AVERAGE_STATISTICS_BATCH = 256
# The run's config as it started, beside its checkpoints: a resumed run must have the same.
CONFIG_FILE = "config.json"
# The trained network, and where the config keeps them, the weights' averages, as a finished
# run saves them: by the prefix of the average's log columns and summary fields.
MODEL_FILE = "model.keras"
AVERAGE_MODEL_FILE = "model_average.keras"
SWA_MODEL_FILE = "model_swa.keras"
AVERAGE_FILES = {"average": AVERAGE_MODEL_FILE, "swa": SWA_MODEL_FILE}
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


def train(config, run_dir, verbose=True, command=None, allow_config_changes=False):
    """Trains `config` in `run_dir`, resuming from its last checkpoint; returns the summary
    (`command`, the command line that runs it, is recorded there).

    Under Keras' TensorFlow backend the steps run under the `tf.distribute` strategy of
    `config.strategy` (`tensorflow_steps.TensorFlowSteps`); under JAX on one device or with Keras'
    data parallelism (`engines.JaxSteps`), under PyTorch on one device (`engines.TorchSteps`).
    All write the same checkpoints (`keras_preact_training.train.checkpoints`), so a run started
    under one backend resumes under another.

    A run records its config in `run_dir/config.json` when it starts; a resumed run whose
    config differs from it in a field outside `RESUMABLE_CHANGES` is refused, unless
    `allow_config_changes` (the new config is then recorded).

    Raises:
        TrainingDiverged: if the loss becomes NaN or infinite (no checkpoint is written).
        ValueError: if the batch size does not divide over the replicas, if `run_dir`
            cannot be made, if the run resumed was started with other settings, or if the
            backend cannot run `config.strategy`.
    """
    run = Run(config, run_dir, verbose, allow_config_changes)
    run.train()
    return run.finish(command)


class Run:
    """One run of `train`: its data, network, optimizer and step engine, resumed from its
    newest checkpoint; its steps, evaluations, checkpoints and log."""

    def __init__(self, config, run_dir, verbose, allow_config_changes):
        check_run_folder(run_dir)  # before anything reads it
        config = precision.resolved(config, run_dir, verbose)
        keras.config.set_dtype_policy(config.precision)
        self.config, self.run_dir, self.verbose = config, run_dir, verbose
        self.steps = engines.for_backend(config)
        if self.steps.chief:
            checked_files.make_directory(run_dir, "run folder")
            check_resumed_config(config, run_dir, allow_config_changes, verbose)
        self.dataset = datasets.load(config)
        self.steps_per_epoch = configs.steps_per_epoch(self.dataset.train.size, config.batch_size)
        self.total_steps = config.total_steps(self.steps_per_epoch)
        keras.utils.set_random_seed(config.seed)
        self.model, self.optimizer = self.steps.build(self.dataset, self.steps_per_epoch)
        self.swa = averaging.EqualAverage.of_run(
            config, self.model.trainable_variables, self.steps_per_epoch, self.total_steps
        )
        # What a checkpoint keeps beside the network and its optimizer.
        self.average_variables = self.swa.variables if self.swa else ()
        self.learning_rates = recipe.schedule(config, self.steps_per_epoch)
        # Every worker restores; the chief alone saves.
        self.checkpoint_dir = os.path.join(run_dir, "checkpoints")
        self.restored = checkpoints.restore_newest_intact(
            self.checkpoint_dir,
            self.model,
            self.optimizer,
            verbose=self.steps.chief and verbose,
            average=self.average_variables,
        )
        self.latest_checkpoint = self.restored
        self.steps.loaded()
        self.first_step = int(keras.ops.convert_to_numpy(self.optimizer.iterations))
        self.per_example_loss = recipe.loss(reduction=None)
        self.pipeline = datasets.input_pipeline(config)
        # A run with a validation split never reads the test set.
        self.evaluated_on = "test" if self.dataset.validation is None else "validation"
        self.evaluation_split = self.dataset.test if self.dataset.validation is None else self.dataset.validation
        self.log = TrainingLog(run_dir, self.first_step, self.steps.chief)
        self.training_seconds, self.error = 0.0, None
        # The averages the run keeps, by prefix, and their errors at the last evaluation.
        self.averages = [kind for kind, kept in (("average", config.average_momentum), ("swa", self.swa)) if kept]
        self.average_errors = {}

    def train(self):
        """The steps from the first not yet trained to the last, logged every `log_every`,
        evaluated every `evaluate_every` and checkpointed every `checkpoint_every` steps."""
        config, steps = self.config, self.steps
        if self.first_step and steps.chief and self.verbose:
            print(f"Resuming from {self.restored} at step {self.first_step} of {self.total_steps}.")
        steps.start(self.dataset.train, self.steps_per_epoch, self.first_step, self.total_steps)
        progress = keras.utils.Progbar(
            self.total_steps,
            stateful_metrics=["loss", "accuracy", "lr", f"{self.evaluated_on}_error"],
            verbose=1 if steps.chief and self.verbose else 0,
        )
        progress.update(self.first_step)
        # Training time counts the steps only (until their loss is back), not evaluations or checkpoints.
        window = Window()
        for step in range(self.first_step + 1, self.total_steps + 1):
            learning_rate = float(self.learning_rates(step - 1))  # the rate of this step: the schedule counts from 0
            started = time.perf_counter()
            loss, correct = steps.step()
            window.add(loss, correct, time.perf_counter() - started)
            if not math.isfinite(loss):
                raise TrainingDiverged(
                    f"Training stopped at step {step}: the loss is {loss}. The last checkpoint "
                    f"({self.latest_checkpoint or 'none'}) is kept; lower the learning rate "
                    f"(--set learning_rate=...) or check the data, then run the same command again."
                )
            if self.swa is not None and self.swa.due(step):
                steps.synchronize()
                self.swa.add(self.model.trainable_variables)
            values = [("loss", loss), ("accuracy", correct / config.batch_size), ("lr", learning_rate)]
            last = step == self.total_steps
            if step % config.log_every == 0 or last:
                values += self.log_window(step, window, learning_rate, step % config.evaluate_every == 0 or last)
                window = Window()
            if step % config.checkpoint_every == 0 or last:
                steps.synchronize()
                if steps.chief:
                    state = checkpoints.state(self.model, self.optimizer, self.average_variables)
                    self.latest_checkpoint = checkpoints.save(self.checkpoint_dir, step, state)
            progress.update(step, values)

    def log_window(self, step, window, learning_rate, evaluating):
        """Writes the log's row of the steps of `window` (and an evaluation where `evaluating`);
        returns the progress bar's values it adds."""
        config = self.config
        self.training_seconds += window.seconds
        row = dict(
            step=step,
            epoch=round(step / self.steps_per_epoch, 3),
            loss=window.loss / window.steps,
            accuracy=window.correct / (window.steps * config.batch_size),
            learning_rate=learning_rate,
            images_per_second=window.steps * config.batch_size / window.seconds,
            hours=round(self.log.earlier_hours + self.training_seconds / 3600, 5),
        )
        values = []
        if evaluating:
            self.steps.synchronize()
            row[f"{self.evaluated_on}_loss"], self.error = self.evaluate()
            row[f"{self.evaluated_on}_error"] = self.error
            values.append((f"{self.evaluated_on}_error", self.error))
            for kind in self.averages:
                if kind == "swa" and not self.swa.snapshots:
                    continue  # not begun
                row[f"{kind}_{self.evaluated_on}_loss"], self.average_errors[kind] = self.evaluate_average(kind)
                row[f"{kind}_{self.evaluated_on}_error"] = self.average_errors[kind]
        self.log.write(row)
        return values

    def evaluate_average(self, kind):
        """(loss, error) of the weights' average `kind` ("average" or "swa"), with BatchNorm
        statistics of its own (`use_average`); the trained state is put back."""
        self.steps.synchronize()
        trained = self.use_average(kind)
        try:
            return self.evaluate()
        finally:
            self.put_back(trained)

    def put_back(self, trained):
        """Puts back the values of every variable of the network (`use_average`'s)."""
        for variable, value in zip(self.model.variables, trained):
            variable.assign(value)

    def evaluate(self):
        """(loss, error) of the network in Keras' variables (`steps.synchronize` puts the
        engine's state there)."""
        losses, correct, count = 0.0, 0, 0
        for images, labels in self.pipeline.evaluation_arrays(self.evaluation_split, EVALUATION_BATCH_SIZE):
            logits = keras.ops.cast(self.steps.predict(images), "float32")
            labels = np.asarray(labels)
            losses += float(keras.ops.sum(self.per_example_loss(labels, logits)))
            correct += int(np.sum(np.argmax(keras.ops.convert_to_numpy(logits), -1) == labels))
            count += len(labels)
        return losses / count, 1.0 - correct / count

    def use_average(self, kind):
        """Puts the weights' average `kind` in the network, "average" the moving one (the
        optimizer's) or "swa" the equal one, with BatchNorm statistics of its own
        (`average_statistics`: the trained network's would not fit the averaged weights);
        returns the values of every variable before, to put back."""
        trained = [np.array(variable) for variable in self.model.variables]
        if kind == "swa":
            self.swa.assign_to(self.model.trainable_variables)
        else:
            self.optimizer.finalize_variable_values(self.model.trainable_variables)
        average_statistics(self.model, self.dataset.train, self.pipeline)
        return trained

    def finish(self, command):
        """The final evaluation (where the last step did none), the saved networks (the trained
        one, and the weights' average where the config keeps one) and summary."""
        self.steps.synchronize()
        if self.error is None:
            _, self.error = self.evaluate()
        summary = self.log.finish(
            self.config,
            self.dataset,
            self.model,
            self.evaluated_on,
            self.error,
            self.training_seconds,
            self.total_steps,
            command,
        )
        for kind in self.averages:
            if kind not in self.average_errors:
                _, self.average_errors[kind] = self.evaluate_average(kind)
            trained = self.use_average(kind)
            summary = self.log.finish_average(self.model, kind, self.evaluated_on, self.average_errors[kind], summary)
            self.put_back(trained)
        if self.verbose and self.steps.chief:
            averages = "; ".join(
                f"the {configs.AVERAGE_NAMES[kind]}: {100 * self.average_errors[kind]:.2f} %" for kind in self.averages
            )
            print(
                f"Final {self.evaluated_on} error {100 * self.error:.2f} %{f' ({averages})' if averages else ''} "
                f"after {self.total_steps} steps; "
                f"{summary['training_images_per_second']:.0f} images/s this session; weights sha256 "
                f"{summary['weights_sha256'][:16]}; run in {self.run_dir}."
            )
        return summary


class Window:
    """The steps since the last row of the log: their losses, correct answers and seconds."""

    def __init__(self):
        self.loss, self.correct, self.seconds, self.steps = 0.0, 0.0, 0.0, 0

    def add(self, loss, correct, seconds):
        self.loss, self.correct, self.seconds, self.steps = (
            self.loss + loss,
            self.correct + correct,
            self.seconds + seconds,
            self.steps + 1,
        )


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


# The files a run writes over in its folder: a folder that holds any of them is a run of ours, or
# is refused (its checkpoints and TensorBoard folders only gain files of their own).
RUN_FILES = (CONFIG_FILE, "log.csv", "summary.json", "curves.png", MODEL_FILE, *AVERAGE_FILES.values())
# The fields that every run's config.json has held.
RUN_CONFIG_FIELDS = ("model", "dataset", "batch_size", "learning_rate")


def check_run_folder(run_dir):
    """Raises ValueError, in one line, where `run_dir` holds files of the names a run writes
    (`RUN_FILES`) but is not a run of ours (no config.json that keras-preact wrote): training
    would overwrite the user's files. A new folder, an empty one, one with other files only and a
    run of ours pass."""
    if not os.path.isdir(run_dir):
        return
    present = sorted(name for name in RUN_FILES if os.path.lexists(os.path.join(run_dir, name)))
    if not present:
        return
    try:
        recorded = checked_files.read_json(os.path.join(run_dir, CONFIG_FILE), "")
        ours = all(field in recorded for field in RUN_CONFIG_FIELDS)
    except (OSError, ValueError):
        ours = False
    if not ours:
        raise ValueError(
            f"{run_dir} is not a run of keras-preact train (no config.json of a run), yet it holds "
            f"{', '.join(present)}, which training would overwrite: choose another --run-dir. Received: "
            f"run_dir={run_dir!r}"
        )


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
        recorded = checked_files.read_json(path, "move the run folder away to train from the start")
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
    # Whole or not at all: a run stopped while writing it is still one of ours.
    with open(path + ".tmp", "w") as file:
        json.dump(now, file, indent=2)
    os.replace(path + ".tmp", path)


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
        if tensorflow_import.tensorflow_installed():
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
            self.csv_path,
            os.path.join(self.run_dir, "curves.png"),
            title=f"{config.model} on {datasets.name(config)}",
            averages=configs.AVERAGE_NAMES,
        )
        model.save(os.path.join(self.run_dir, MODEL_FILE))
        self.write_summary(summary)
        return summary

    def finish_average(self, model, kind, evaluated_on, error, summary):
        """The summary with the error and digest of the weights' average `kind` ("average" or
        "swa"), `model` (holding that average) saved beside the trained network."""
        summary = dict(
            summary, **{f"{kind}_{evaluated_on}_error": error, f"{kind}_weights_sha256": weights_digest(model)}
        )
        if self.chief:
            model.save(os.path.join(self.run_dir, AVERAGE_FILES[kind]))
            self.write_summary(summary)
        return summary

    def write_summary(self, summary):
        with open(os.path.join(self.run_dir, "summary.json"), "w") as file:
            json.dump(summary, file, indent=2)

    def images_per_second(self):
        if not self.chief:
            return float("nan")
        with open(self.csv_path) as file:
            rates = [float(row["images_per_second"]) for row in csv.DictReader(file) if row["images_per_second"]]
        return float(np.median(rates)) if rates else float("nan")
