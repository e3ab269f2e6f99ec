"""`keras-preact tune`: the paper's gate-bias search (Table 1) with keras-tuner.

The paper initialises the gates' bias b_g of exclusive gating (Fig. 2(c)) and
shortcut-only gating (Fig. 2(d)) at values "from 0 to -10 with a decrement step of -1 on
the training set by cross-validation", then trains the best on the training set. Here a
keras-tuner `HyperModel` spans exactly those values for each gating; every trial trains
with the config's recipe (`model.fit` on in-memory images, the recipe's layers,
schedule and weight decay) on the training set less a held-out validation split, and
its objective is the error on that split, never the test set. The best (gating, b_g) is
then trained on the whole training set with `keras_preact_training.train.loop.train` and evaluated on the
test set. keras-tuner keeps its state in the output folder: the same command run again
resumes the search, skipping finished trials, and the final run resumes from its
checkpoints.

Writes `gate_bias.md`, `gate_bias.csv` (b_g against validation error, the paper's test
errors beside) and `gate_bias.png`.

Across processes and machines the search runs in keras-tuner's own distributed mode: one
chief holds the grid's oracle and serves it over gRPC, and workers ask it for trials,
each training its trials with the config's strategy (`tune_processes.distribute` sets keras-tuner's
environment variables from `--chief` and `--worker`). A trial keeps a backup in its
folder, so that a worker started again under the same id takes its trial back and goes on
from the last backup; a chief started again reloads the oracle from the output folder.
"""

import dataclasses
import itertools
import json
import os

import grpc
import keras
import keras_tuner
import numpy as np
import tensorflow as tf

from ..data import datasets, input_tensorflow
from ..train import configs, loop, recipe, tensorflow_steps
from . import DEFAULT_VALIDATION_EXAMPLES, GATE_BIASES, GATINGS, ablation, tune_results
from .tune_processes import ORACLE_HOST, ORACLE_PORT, TUNER_ID, role

# Table 1's test errors (%) of ResNet-110 on CIFAR-10, full recipe, median of 5 runs.
PAPER, FAIL = ablation.GATE_BIAS_ERRORS, ablation.FAIL
OBJECTIVE = "val_error"


@keras.saving.register_keras_serializable(package="keras_preact_training")
class ClassificationError(keras.metrics.SparseCategoricalAccuracy):
    """1 - accuracy: the paper's "error", on logits or probabilities."""

    def __init__(self, name="error", **kwargs):
        super().__init__(name=name, **kwargs)

    def result(self):
        return 1.0 - super().result()


def in_memory(split):
    """A split's decoded images (float32, 0-255) and labels as arrays."""
    images, labels = zip(*input_tensorflow.evaluation_arrays(split, 500))
    return np.concatenate(images), np.concatenate(labels)


class GateBiasHyperModel(keras_tuner.HyperModel):
    """The gated networks of `config` over the paper's b_g values.

    Args:
        config: a training `Config`; its model, recipe and budget (`duration`).
        input_shape, classes: of the data.
        training_examples: the size of the trials' training set (for the schedule).
        gatings: which of `GATINGS` to search.
        rounds: evaluations of the validation error per trial (keras-tuner's epochs);
            the objective is the best of them, the final one for 1.
    """

    def __init__(
        self, config, input_shape, classes, training_examples, gatings=GATINGS, rounds=1, gate_biases=GATE_BIASES
    ):
        super().__init__(name="gate_bias")
        for gating in gatings:
            if gating not in GATINGS:
                raise ValueError(f"gatings must be among {list(GATINGS)}. Received: {gating!r}")
        check_gate_biases(gate_biases)
        self.config, self.input_shape, self.classes = config, tuple(input_shape), classes
        self.gatings, self.rounds = tuple(gatings), rounds
        self.gate_biases = tuple(bias for bias in GATE_BIASES if bias in gate_biases)
        self.steps_per_epoch = configs.steps_per_epoch(training_examples, config.batch_size)
        self.total_steps = config.total_steps(self.steps_per_epoch)
        if self.total_steps < rounds:
            raise ValueError(f"The budget of {self.total_steps} steps is shorter than rounds={rounds}.")
        # A checkpointed trial trains each round in `pieces` Keras epochs of about
        # `checkpoint_every` steps, backing up after each.
        self.pieces = -(-(self.total_steps // rounds) // config.checkpoint_every)

    def trial_config(self, hp):
        return dataclasses.replace(self.config, merge=hp.get("gating"), gate_bias=float(hp.get("gate_bias")))

    def build(self, hp):
        hp.Choice("gating", list(self.gatings))
        hp.Choice("gate_bias", list(self.gate_biases), ordered=True)
        config = self.trial_config(hp)
        keras.utils.set_random_seed(config.seed)  # every trial starts from the same weights' seed
        model = recipe.training_model(config, self.input_shape, self.classes, seed=config.seed)
        model.compile(
            recipe.optimizer(config, self.steps_per_epoch, model),
            recipe.loss(config.label_smoothing),
            metrics=[ClassificationError()],
        )
        return model

    def fit(self, hp, model, training, validation, callbacks=None, verbose=1, trial_folder=None, **kwargs):
        """Trains a trial. With `trial_folder` (a checkpointed tuner's), the trial backs up to
        it after each piece and, started again, goes on from its last backup; the objective
        is then the best of its rounds' validation errors, kept in the folder across restarts."""
        images, labels = training
        batches = (
            tf.data.Dataset.from_tensor_slices((images, labels))
            .shuffle(len(labels), seed=self.config.seed, reshuffle_each_iteration=True)
            .repeat()
            .batch(self.config.batch_size, drop_remainder=True)
            .prefetch(tf.data.AUTOTUNE)
        )
        rounds = kwargs.get("epochs", self.rounds)
        steps = self.total_steps // self.rounds
        if trial_folder is None:
            return model.fit(
                batches,
                validation_data=validation,
                epochs=rounds,
                initial_epoch=kwargs.get("initial_epoch", 0),
                steps_per_epoch=steps,
                callbacks=callbacks,
                verbose=verbose,
            )
        backup = os.path.join(trial_folder, "backup")
        errors = RoundErrors(os.path.join(trial_folder, "round_errors.json"), fresh=not os.path.isdir(backup))
        model.fit(
            batches,
            validation_data=validation,
            validation_freq=self.pieces,
            epochs=rounds * self.pieces,
            steps_per_epoch=steps // self.pieces,
            verbose=verbose,
            # The round's error is kept before the backup that would skip its piece.
            callbacks=[*(callbacks or []), errors, keras.callbacks.BackupAndRestore(backup, double_checkpoint=True)],
        )
        return {OBJECTIVE: min(errors.errors)}


def check_gate_biases(gate_biases):
    """Raises ValueError unless `gate_biases` are some of the paper's b_g values."""
    if not gate_biases or any(bias not in GATE_BIASES for bias in gate_biases):
        raise ValueError(f"gate_biases must be some of the paper's {list(GATE_BIASES)}. Received: {list(gate_biases)}")


class RoundErrors(keras.callbacks.Callback):
    """The validation error of each round of a trial, in a JSON file that outlives its
    process (a fresh trial starts it empty)."""

    def __init__(self, path, fresh):
        super().__init__()
        self.path = path
        if fresh and os.path.exists(path):
            os.remove(path)
        self.errors = []
        if os.path.exists(path):
            with open(path) as file:
                self.errors = json.load(file)

    def on_epoch_end(self, epoch, logs=None):
        if logs and OBJECTIVE in logs:
            self.errors.append(float(logs[OBJECTIVE]))
            with open(self.path + ".tmp", "w") as file:
                json.dump(self.errors, file)
            os.replace(self.path + ".tmp", self.path)


class GridOracle(keras_tuner.Oracle):
    """Every combination of the search space, in order, each once: a grid search whose next
    trial is the first combination no trial holds yet, so that a search reloaded from its
    folder goes on where it stopped, and workers asking at once get different trials.
    (keras-tuner runs a trial that was running when its process stopped again, under its
    own id, before any new one; keras-tuner 1.4.8's own `GridSearch` does not save the
    queue it walks the grid with, and a reloaded grid search stops at once.)"""

    def populate_space(self, trial_id):
        taken = [trial.hyperparameters.values for trial in self.trials.values()]
        names = [parameter.name for parameter in self.hyperparameters.space]
        for combination in itertools.product(*(parameter.values for parameter in self.hyperparameters.space)):
            values = dict(zip(names, combination))
            if values not in taken:
                return {"status": keras_tuner.engine.trial.TrialStatus.RUNNING, "values": values}
        return {"status": keras_tuner.engine.trial.TrialStatus.STOPPED, "values": None}

    def set_state(self, state):
        super().set_state(state)
        self.running_when_saved = dict(self.ongoing_trials)

    def reload(self):
        """The search as saved in its folder. keras-tuner hands a trial that was running out
        again, first; in a search across processes its worker may still be training it and
        reports it to the chief started again: there each running trial stays its worker's
        (which also gets it back if it starts again under its id), shown as begun. This reads
        two attributes of keras-tuner's `Oracle` that have no public API, `_retry_queue` and
        `_display` (keras-tuner pinned to 1.4; tests/test_search.py names them)."""
        super().reload()
        if role() != "chief":
            return
        for tuner_id, trial in self.running_when_saved.items():
            self._retry_queue.remove(trial.trial_id)
            self.ongoing_trials[tuner_id] = trial
            self._display.on_trial_begin(trial)


class Checkpointed:
    """A tuner whose trials back up to their folders (`GateBiasHyperModel.fit`): a trial
    whose process stopped goes on from its last backup where it runs again."""

    def run_trial(self, trial, *arguments, **options):
        return super().run_trial(trial, *arguments, trial_folder=self.get_trial_dir(trial.trial_id), **options)


class GridTuner(Checkpointed, keras_tuner.Tuner):
    """The paper's grid (`GridOracle`), each trial checkpointed."""


class RandomTuner(Checkpointed, keras_tuner.RandomSearch):
    """keras-tuner's random search, each trial checkpointed."""


# Hyperband's trials go on from earlier trials' weights: it trains them without backups.
TUNERS = {
    "grid": lambda hypermodel, objective, trials, seed, **common: GridTuner(
        GridOracle(objective, max_trials=trials, seed=seed), hypermodel, **common
    ),
    "random": lambda hypermodel, objective, trials, seed, **common: RandomTuner(
        hypermodel, objective, max_trials=trials, seed=seed, **common
    ),
    "hyperband": lambda hypermodel, objective, trials, seed, **common: keras_tuner.Hyperband(
        hypermodel, objective, max_epochs=hypermodel.rounds, seed=seed, **common
    ),
}


def search(
    config,
    output,
    gatings=GATINGS,
    tuner="grid",
    trials=None,
    validation_examples=DEFAULT_VALIDATION_EXAMPLES,
    rounds=1,
    retrain=True,
    verbose=1,
    gate_biases=GATE_BIASES,
):
    """Runs (or resumes) the search in `output`; writes its table and plot.

    Args:
        config: a training `Config` (model, data, recipe, budget, strategy, seed).
        output: folder of keras-tuner's state, the tables, the plot and the final run.
        gatings: which gatings to search.
        gate_biases: which of the paper's b_g (0 to -10) to search.
        tuner: "grid" (the paper's), "random" or "hyperband".
        trials: the most trials; `None` for the whole grid (11 per gating, or the
            `gate_biases` given).
        validation_examples: held out of the training set for the objective.
        rounds: validation evaluations per trial (Hyperband's max_epochs, at least 3).
        retrain: train the best on the whole training set and test it.

    Returns:
        dict(results=[(gating, b_g, validation error %)], best=(gating, b_g),
        test_error=% or None).
    """
    if tuner not in TUNERS:
        raise ValueError(f"tuner must be one of {sorted(TUNERS)}. Received: tuner={tuner!r}")
    if trials is not None and (not isinstance(trials, int) or trials < 1):
        raise ValueError(f"trials must be a positive integer. Received: trials={trials!r}")
    if not isinstance(rounds, int) or rounds < 1 or (tuner == "hyperband" and rounds < 3):
        raise ValueError(f"rounds must be a positive integer (at least 3 for hyperband). Received: rounds={rounds!r}")
    check_gate_biases(gate_biases)
    dataset = datasets.load(config, splits=("train",))
    training_indices, validation_indices = datasets.validation_split(
        dataset.train.size, validation_examples, config.seed
    )
    images, labels = in_memory(dataset.train)
    training = images[training_indices], labels[training_indices]
    validation = images[validation_indices], labels[validation_indices]
    hypermodel = GateBiasHyperModel(
        config, dataset.image_shape, len(dataset.class_names), len(training_indices), gatings, rounds, gate_biases
    )
    searcher = make_searcher(tuner, hypermodel, trials, config, output, verbose)
    try:
        searcher.search(training, validation, verbose=verbose)
    except grpc.RpcError as error:
        raise ConnectionError(
            f"The chief at {os.environ[ORACLE_HOST]}:{os.environ[ORACLE_PORT]} stopped answering ({error.code().name}): "
            f"start it again with its command, then this worker with the same --worker-id "
            f"{os.environ[TUNER_ID]}; it goes on from its trial's last backup."
        ) from None
    if role() == "worker":
        print(
            f"Worker {os.environ[TUNER_ID]}: the search has no trial left for it; the chief writes the results "
            f"to {output}."
        )
        return dict(results=None, best=None, test_error=None)
    results = trial_results(searcher)
    best = min(results, key=lambda result: result[2])[:2] if results else None
    test_error = None
    if retrain and best:
        final = dataclasses.replace(config, merge=best[0], gate_bias=float(best[1]))
        run_dir = os.path.join(output, f"best_{best[0]}_{best[1]}")  # resumes only the same network
        summary = loop.train(final, run_dir, verbose=bool(verbose))
        test_error = 100 * summary["test_error"]
    tune_results.write_results(
        output, config, results, best, test_error, len(training_indices), len(validation_indices)
    )
    return dict(results=results, best=best, test_error=test_error)


def make_searcher(tuner, hypermodel, trials, config, output, verbose):
    """The keras-tuner tuner of the search: `tuner`'s, in `output`, resumed where it stopped,
    each trial under `config.strategy`."""
    strategy = None if config.strategy == "default" else tensorflow_steps.make_strategy(config)
    if strategy and verbose:
        print(f"Each trial runs under {type(strategy).__name__} with {strategy.num_replicas_in_sync} replicas.")
    limit = trials or len(hypermodel.gatings) * len(hypermodel.gate_biases)
    searcher = TUNERS[tuner](
        hypermodel,
        keras_tuner.Objective(OBJECTIVE, "min"),
        limit,
        config.seed,
        directory=output,
        project_name=f"gate_bias_{config.model}",
        overwrite=False,
        distribution_strategy=strategy,
    )
    if tuner != "hyperband":  # a resumed search keeps its saved limit unless told another
        searcher.oracle.max_trials = limit
    return searcher


def trial_results(searcher):
    """(gating, b_g, validation error %) of every finished trial, in the grid's order."""
    results = []
    for trial in searcher.oracle.trials.values():
        if trial.status == "COMPLETED" and trial.score is not None:
            results.append(
                (
                    trial.hyperparameters.get("gating"),
                    int(trial.hyperparameters.get("gate_bias")),
                    100 * float(trial.score),
                )
            )
    return sorted(results, key=lambda result: (GATINGS.index(result[0]), -result[1]))
