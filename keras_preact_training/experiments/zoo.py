"""`keras-preact publish`: a finished CIFAR-10 or CIFAR-100 run into the model zoo.

Writes the run's network as `keras_preact/weights/<data set>_<name>.weights.h5` (units as
separate layers, whatever layout it trained in; the trained weights, or where the run kept
one, its moving average (`weights="average"`) or its equal average (`weights="swa"`), whose
entry then keeps the trained weights' errors too, as `final_weights`) and its entry in the registry
(`keras_preact/weights/registry.json`): the file's SHA-256 and size, the network, its
test error as `keras-preact evaluate` measures it on the shipped file (which must
agree with the run's own final evaluation), with the test-time flip and on the training
images (inference mode: how well it fits what it learned from), the run's config,
command as a user types it (`user_command`) and hours, the date and the library versions.
Then `keras_preact.get_model(name, weights="cifar10")` (or "cifar100") loads it. A run of the same recipe
with another seed joins the entry (`add_seed`, `keras-preact publish --another-seed`): its
errors, not its weights.
"""

import datetime
import json
import os
import platform
import shlex
import tempfile

import keras
import numpy as np

import keras_preact
from keras_preact import checksums, pretrained

from .. import checked_files
from ..data import datasets
from ..train import configs, evaluate, loop, recipe  # noqa: F401  (recipe's layers, which a run's model.keras holds)

# What the zoo's networks train and are tested on, by data set, named by what it is (the networks
# trained on the JPEG copy before say so in their own entries).
DATA_DESCRIPTIONS = {
    "cifar10": (
        "CIFAR-10 (Krizhevsky, 2009) with its original pixels, as PNG files in folders of a class each "
        "(`keras-preact data` makes them from cifar-10-python.tar.gz): 50,000 training and 10,000 test images"
    ),
    "cifar100": (
        "CIFAR-100 (Krizhevsky, 2009) with its original pixels, as PNG files in folders of a fine class each "
        "(`keras-preact data` makes them from cifar-100-python.tar.gz): 50,000 training and 10,000 test images "
        "of 100 classes"
    ),
}
# Which of a run's networks is shipped: the trained weights, or an average of the weights the
# run kept, by the file a finished run saves each in.
WEIGHTS = {"final": loop.MODEL_FILE, **loop.AVERAGE_FILES}


def user_data_dir(data_dir):
    """A data directory as a user names it: the folder's own name ("cifar10-png"), without
    the machine's path to it; None stays None (tensorflow-datasets' default)."""
    return None if data_dir is None else datasets.folder_name(data_dir)


def user_command(command, data_dir=True):
    """A run's command as a user would type it: `--data-dir` names the data folder alone
    (`user_data_dir`), and `--run-dir` (a folder of the machine that trained it) is left out,
    so that the run goes to its default `runs/<config>-<model>`. With `data_dir=False` the
    data folder is left out too (the zoo table's recipe)."""
    if not command:
        return command
    dropped = ("--run-dir",) if data_dir else ("--run-dir", "--data-dir")
    kept = []
    for word in shlex.split(command):
        if kept and kept[-1] in dropped:
            kept.pop()
        elif kept and kept[-1] == "--data-dir":
            kept.append(user_data_dir(word))
        elif word.startswith(tuple(f"{option}=" for option in dropped)):
            continue
        elif word.startswith("--data-dir="):
            kept.append(f"--data-dir={user_data_dir(word.split('=', 1)[1])}")
        else:
            kept.append(word)
    return shlex.join(kept)


# The shipped file's error in the run's precision and the run's final one are the same
# network on the same images; they may differ by kernels' rounding only (a prediction or
# two of 10,000). Between precisions they differ by more (a network trained in bfloat16 errs
# on a dozen images more or less in float32, docs/zoo.md), so the check computes in the run's.
AGREEMENT = 0.001
# Package data is kept small: at most 16 MB a shipped file.
MAXIMUM_BYTES = 16 * 2**20


def publish(
    run_dir, name, data_dir=None, weights_directory=None, registry_file=None, images_per_second=None, weights="final"
):
    """Publishes the network of the finished run in `run_dir` as `name`'s weights for its data set.

    Args:
        run_dir: a finished run of `keras-preact train` on CIFAR-10 or CIFAR-100 (all 50,000
            training images, tested on the test set).
        name: the network's name in `keras_preact.list_models()` ("resnet20", "resnet20_original", ...).
        data_dir: the run's data directory (CIFAR-10 image folders or tensorflow-datasets'),
            for the evaluation of the shipped file; the run's own by default.
        weights_directory, registry_file: where the files go (the package's by default).
        images_per_second: the network's training rate measured alone on the machine that
            trained it (`python bench/training_throughput.py`), where the run shared its
            cores: the entry then records the hours the run's images take at that rate
            (`hours_alone`) beside the run's own wall-clock `training_hours`.
        weights: "final" (the trained weights), "average" (the weights' moving average of a
            run that kept one) or "swa" (their equal average); for an average the entry's
            `final_weights` holds the trained weights' errors too.

    Returns:
        The registry entry.

    Raises:
        ValueError: for a run that is not a finished CIFAR-10 or CIFAR-100 run of that network,
            `weights` an average the run did not keep, or a shipped file whose test
            error disagrees with the run's.
        FileNotFoundError: for a missing run.
    """
    check_images_per_second(images_per_second)
    summary, dataset = finished_run(run_dir)
    check_weights(weights, summary, run_dir)
    config = summary["config"]
    path, shipped = save_network(run_dir, name, weights_directory or pretrained.WEIGHTS_DIRECTORY, dataset, weights)
    size = os.path.getsize(path)
    try:
        errors = measure(name, path, summary, data_dir, weights)
        if weights != "final":
            with tempfile.TemporaryDirectory() as directory:
                final_path, _ = save_network(run_dir, name, directory, dataset, "final")
                final = measure(name, final_path, summary, data_dir, "final")
            errors["final_weights"] = {key: final[key] for key in ("test_error", "flip_test_error", "train_error")}
    except ValueError:
        os.remove(path)
        raise
    entry = dict(
        file=os.path.basename(path),
        sha256=checksums.sha256(path),
        bytes=size,
        parameters=sum(int(np.prod(weight.shape)) for weight in shipped.trainable_weights),
        weights=weights,
        **errors,
        data=DATA_DESCRIPTIONS[dataset],
        command=user_command(summary.get("command")),
        config=dict(config, data_dir=user_data_dir(config.get("data_dir"))),
        **hours(summary, images_per_second),
        date=datetime.date.today().isoformat(),
        versions=dict(
            keras_preact=keras_preact.__version__,
            keras=keras.__version__,
            backend=keras.backend.backend(),
            tensorflow=_tensorflow_version(),
            python=platform.python_version(),
        ),
    )
    register(registry_file or pretrained.REGISTRY_FILE, dataset, name, entry)
    return entry


def check_weights(weights, summary, run_dir):
    """Raises a ValueError unless `weights` is a key of `WEIGHTS` that the run saved."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {sorted(WEIGHTS)}. Received: weights={weights!r}")
    if weights != "final" and f"{weights}_test_error" not in summary:
        raise ValueError(
            f"The run in {run_dir} kept no such average of its weights (train with --set "
            f"{configs.AVERAGE_SETTINGS[weights]}=...). Received: weights={weights!r}"
        )


def add_seed(run_dir, name, data_dir=None, registry_file=None, images_per_second=None):
    """Adds the finished run in `run_dir`, `name`'s shipped recipe trained again with another
    seed, to `name`'s registry entry: its errors (`measure`), seed, command and hours join the
    entry's `other_seeds`, whose tables give the mean and standard deviation over every seed
    the entry holds. The shipped weights stay the entry's own.

    Args:
        run_dir, data_dir, images_per_second: as `publish` takes them.
        name: a network with a registry entry.
        registry_file: the registry (the package's by default).

    Returns:
        The registry entry.

    Raises:
        ValueError: where `name` has no entry, where the run differs from the entry by more
            than its seed (recipe or data), or where its seed is one the entry holds already.
        FileNotFoundError: for a missing run.
    """
    check_images_per_second(images_per_second)
    registry_file = registry_file or pretrained.REGISTRY_FILE
    summary, dataset = finished_run(run_dir)
    entry = pretrained.registry(registry_file).get(dataset, {}).get(name) if os.path.isfile(registry_file) else None
    if entry is None:
        raise ValueError(
            f"name must be a network with a registry entry, whose recipe the run trained with another seed "
            f"(`keras-preact publish` its first run). Received: name={name!r}"
        )
    config = dict(summary["config"], data_dir=user_data_dir(summary["config"].get("data_dir")))
    differences = recipe_differences(entry["config"], config, apart_from=("seed",))
    if entry["data"] != DATA_DESCRIPTIONS[dataset]:
        differences.append("data")
    if differences:
        raise ValueError(
            f"The run in {run_dir} is not {name}'s shipped recipe with another seed: it differs in "
            f"{', '.join(differences)}. Received: run_dir={run_dir!r}"
        )
    seeds = [seed_of(entry["config"]), *(other["seed"] for other in entry.get("other_seeds", ()))]
    if seed_of(config) in seeds:
        raise ValueError(
            f"{name}'s entry holds seed {seed_of(config)} already (its seeds: {seeds}); the run must have another. "
            f"Received: run_dir={run_dir!r}"
        )
    weights = entry.get("weights", "final")
    check_weights(weights, summary, run_dir)
    with tempfile.TemporaryDirectory() as directory:
        path, _ = save_network(run_dir, name, directory, dataset, weights)
        errors = measure(name, path, summary, data_dir, weights)
    for shipped_file_only in ("per_class_accuracy", "test_predictions"):
        errors.pop(shipped_file_only)
    entry.setdefault("other_seeds", []).append(
        dict(
            seed=seed_of(config),
            **errors,
            command=user_command(summary.get("command")),
            **hours(summary, images_per_second),
            date=datetime.date.today().isoformat(),
        )
    )
    register(registry_file, dataset, name, entry)
    return entry


def seed_of(config):
    """The seed of a run's config (one that predates the field had `Config`'s default)."""
    return config.get("seed", configs.field_defaults()["seed"])


# Config fields that say how a run was logged, where its files were, or which kernels and
# layout computed the same network (to float rounding, `keras_preact_training.train.configs.Config`), not what it trained.
NOT_RECIPE = (
    "model",
    "unit",
    "data_dir",
    "checkpoint_every",
    "evaluate_every",
    "log_every",
    "scan_units",
    "rematerialize",
    "fused_batch_norm",
    "deterministic",
)


def recipe_differences(first, second, apart_from=()):
    """The fields, sorted, in which two runs' configs differ outside `NOT_RECIPE` and
    `apart_from` (a field a config predates had `Config`'s default)."""
    defaults = configs.field_defaults()
    # As a run's config.json holds them (tuples as lists).
    first, second = (json.loads(json.dumps({**defaults, **config})) for config in (first, second))
    return [
        field
        for field in sorted(set(first) | set(second))
        if field not in (*NOT_RECIPE, *apart_from) and first.get(field) != second.get(field)
    ]


def same_recipe(first, second):
    """Whether two registry entries' networks were trained by the same recipe on the same data
    (every config field but the network and `NOT_RECIPE`'s, and the data they describe)."""
    return not recipe_differences(first["config"], second["config"]) and first["data"] == second["data"]


def check_images_per_second(images_per_second):
    """Raises a ValueError naming `images_per_second` unless it is None or a positive number."""
    if images_per_second is not None and not (
        isinstance(images_per_second, (int, float)) and 0 < images_per_second < float("inf")
    ):
        raise ValueError(
            f"images_per_second must be a positive number. Received: images_per_second={images_per_second!r}"
        )


def measure(name, path, summary, data_dir=None, weights="final"):
    """The errors of `name`'s weights file `path` (saved from the run of `summary`: its trained
    network, or with `weights` "average" or "swa" that average of its weights) on the run's
    data (or `data_dir`): on the test images in float32, single crop and with the flip, its
    per-class accuracy and the class it gives each test image (`test_predictions`, the class
    ids as digits, `prediction_text`: one an image for CIFAR-10, two for CIFAR-100, an image in the test split's order: what a check on a few of the images compares with), and
    on the training images in inference mode.

    Raises:
        ValueError: where the file's test error in the run's precision disagrees with the
            run's own final one (`AGREEMENT`).
    """
    config = summary["config"]
    data_dir = data_dir or config["data_dir"]
    # The registry's errors are float32's, as `weights="cifar10"` loads the network; the
    # check against the run's own evaluation computes in the run's precision.
    result = evaluate.evaluate(name, path, config["dataset"], data_dir, flip=True)
    precision = config.get("precision", "float32")
    as_run = (
        result
        if precision == "float32"
        else evaluate.evaluate(name, path, config["dataset"], data_dir, precision=precision)
    )
    run_error = summary["test_error" if weights == "final" else f"{weights}_test_error"]
    if abs(as_run["error"] - run_error) > AGREEMENT:
        raise ValueError(
            f"The shipped file's test error in the run's precision, {precision} ({100 * as_run['error']:.2f} %), "
            f"differs from the run's ({100 * run_error:.2f} %): the network or its preprocessing is not "
            f"the run's."
        )
    training_set = evaluate.evaluate(name, path, config["dataset"], data_dir, split="train")
    return dict(
        test_error=round(result["error"], 6),
        flip_test_error=round(result["flip_error"], 6),
        train_error=round(training_set["error"], 6),
        per_class_accuracy={label: round(value, 4) for label, value in result["per_class_accuracy"].items()},
        test_predictions=prediction_text(result["predictions"], len(result["per_class_accuracy"])),
    )


def prediction_text(predictions, classes):
    """The class ids of `predictions` as one string of digits, each id padded to the digits of
    `classes - 1` (one for CIFAR-10, two for CIFAR-100): how the registry keeps them small."""
    width = len(str(classes - 1))
    return "".join(f"{int(label):0{width}d}" for label in predictions)


def predictions_of(text, classes):
    """The class ids of a `prediction_text` string, as an int64 array."""
    width = len(str(classes - 1))
    return np.array([int(text[index : index + width]) for index in range(0, len(text), width)], "int64")


def finished_run(run_dir):
    """(summary, data set: "cifar10" or "cifar100") of the finished run in `run_dir`, checked to be
    one the zoo publishes.

    Raises:
        FileNotFoundError: for a missing run.
        ValueError: for a run that held out a validation split, used a subset, or is not on
            CIFAR-10 or CIFAR-100.
    """
    summary_path = os.path.join(run_dir, "summary.json")
    if not os.path.isfile(summary_path):
        raise FileNotFoundError(
            f"run_dir must be a finished training run (with summary.json). Received: run_dir={run_dir!r}"
        )
    summary = checked_files.read_json(summary_path, "train the run again, or restore the file")
    config = summary["config"]
    problems = []
    if summary.get("evaluated_on", "test") != "test" or config.get("validation_examples") is not None:
        problems.append("it held out a validation split (zoo networks train on the whole training set)")
    if config.get("train_examples") is not None or config.get("test_examples") is not None:
        problems.append("it used a subset of the data")
    dataset = pretrained.dataset_of(summary["class_names"])
    if dataset is None or tuple(summary["image_shape"]) != (32, 32, 3):
        problems.append("its data set is neither CIFAR-10 nor CIFAR-100")
    if problems:
        raise ValueError(
            f"Only finished CIFAR-10 and CIFAR-100 runs are published; {run_dir} is not: {'; '.join(problems)}. "
            f"Received: run_dir={run_dir!r}"
        )
    return summary, dataset


def save_network(run_dir, name, weights_directory, dataset="cifar10", weights="final"):
    """(path, network) of the run's network (`weights`: its trained one, "average" or "swa") saved as
    `weights_directory/<dataset>_<name>.weights.h5`, its units as separate layers, whatever
    layout it trained in.

    Raises:
        ValueError: where `name` is not the run's network, or the file passes `MAXIMUM_BYTES`.
    """
    network = keras.saving.load_model(os.path.join(run_dir, WEIGHTS[weights])).layers[-1]
    if network.name != name or name not in keras_preact.MODELS:
        raise ValueError(
            f"name must be the run's network, {network.name!r}, a name of keras_preact.list_models(). "
            f"Received: name={name!r}"
        )
    shipped = keras_preact.get_model(name, classes=len(pretrained.DATASETS[dataset]["classes"]))
    keras_preact.copy_weights(network, shipped)
    os.makedirs(weights_directory, exist_ok=True)
    path = os.path.join(weights_directory, f"{dataset}_{name}.weights.h5")
    shipped.save_weights(path)
    size = os.path.getsize(path)
    if size > MAXIMUM_BYTES:
        os.remove(path)
        raise ValueError(
            f"{name}'s weights take {size} bytes, more than the package's {MAXIMUM_BYTES}. Received: name={name!r}"
        )
    return path, shipped


def hours(summary, images_per_second):
    """The run's own hours and images/s, and with `images_per_second` (its rate measured alone)
    the hours its images take alone."""
    recorded = dict(
        training_hours=summary.get("training_hours"),
        training_images_per_second=round(summary["training_images_per_second"], 1),
    )
    if images_per_second is not None:
        alone = summary["steps"] * summary["config"]["batch_size"] / images_per_second / 3600
        recorded.update(images_per_second_alone=images_per_second, hours_alone=round(alone, 4))
    return recorded


def register(registry_file, dataset, name, entry):
    """Writes `entry` as `name`'s entry for `dataset` in the registry file."""
    registry = {}
    if os.path.isfile(registry_file):
        registry = checked_files.read_json(registry_file, "restore it from the repository (git checkout)")
    registry.setdefault(dataset, {})[name] = entry
    with open(registry_file, "w") as file:
        json.dump(registry, file, indent=2, sort_keys=True)
        file.write("\n")


def _tensorflow_version():
    import tensorflow as tf

    return tf.__version__
