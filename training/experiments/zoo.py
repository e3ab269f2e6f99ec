"""`keras-preact publish`: a finished CIFAR-10 run into the model zoo.

Writes the run's network as `keras_preact/weights/cifar10_<name>.weights.h5` (units as
separate layers, whatever layout it trained in) and its entry in the registry
(`keras_preact/weights/registry.json`): the file's SHA-256 and size, the network, its
test error as `keras-preact evaluate` measures it on the shipped file (which must
agree with the run's own final evaluation), with the test-time flip and on the training
images (inference mode: how well it fits what it learned from), the run's config,
command as a user types it (`user_command`) and hours, the date and the library versions.
Then `keras_preact.get_model(name, weights="cifar10")` loads it.
"""

import datetime
import json
import os
import platform
import shlex

import keras
import numpy as np

import keras_preact
from keras_preact import checksums, pretrained

from .. import files
from ..data import datasets
from ..train import evaluate, recipe  # noqa: F401  (recipe's layers, which a run's model.keras holds)
from .ablation import TABLES

# Published CIFAR-10 test errors (%) of each depth of the zoo, for its tables: the paper's, by
# unit, as (error, source): He et al. 2015 ("Deep Residual Learning for Image Recognition",
# the paper's [1]), Table 6 (original units, 64k iterations), and this paper's Table 3
# (ResNet-110 and ResNet-164 with either unit, median of 5; its home is `ablation.TABLES`);
# and two public reimplementations' best test epoch of 200 epochs (slightly optimistic),
# akamaster/pytorch_resnet_cifar10 (original units) and chenyaofo/pytorch-cifar-models
# (cosine, weight decay 5e-4). The pre-activation ResNet-20 and -56 have no published row:
# the original networks' are their targets.
TABLE_3 = {unit: row.paper for unit, row in zip(("original", "preactivation"), TABLES[3].rows)}
REFERENCES = {
    "resnet20": dict(original=(8.75, "He 2015"), akamaster=8.27, chenyaofo=7.40),
    "resnet56": dict(original=(6.97, "He 2015"), akamaster=6.61, chenyaofo=5.63),
    "resnet110": dict(
        **{unit: (TABLE_3[unit][("cifar10", "resnet110")], "Table 3") for unit in TABLE_3}, akamaster=6.32
    ),
    "resnet164": {unit: (TABLE_3[unit][("cifar10", "resnet164")], "Table 3") for unit in TABLE_3},
}
UNIT_NAMES = {"original": "original", "preactivation": "pre-activation"}


def depth_and_unit(name):
    """ "resnet56_original" -> ("resnet56", "original"); "resnet56" -> ("resnet56", "preactivation")."""
    if name.endswith("_original"):
        return name[: -len("_original")], "original"
    return name, "preactivation"


def paper_error(name, own_unit_only=False):
    """The paper's error of the zoo network `name` as the tables print it: "6.37 (Table 3)" for
    its own unit's row, else the other unit's, "8.75 (He 2015, original)" (or "none" with
    `own_unit_only`); "" for a depth the paper does not report."""
    depth, unit = depth_and_unit(name)
    published = REFERENCES.get(depth, {})
    if unit in published:
        return f"{published[unit][0]:.2f} ({published[unit][1]})"
    other = "original" if unit == "preactivation" else "preactivation"
    if other in published:
        return "none" if own_unit_only else f"{published[other][0]:.2f} ({published[other][1]}, {UNIT_NAMES[other]})"
    return ""


def in_table_order(registry=None):
    """The shipped CIFAR-10 networks as (name, registry entry) pairs in the zoo table's
    order: by size, then name (the pre-activation network before its original)."""
    entries = (registry or pretrained.registry()).get("cifar10", {})
    return sorted(entries.items(), key=lambda item: (item[1]["parameters"], item[0]))


def trained_on(entry):
    """What a registry entry's network trained on, as the zoo's table says it: the original
    images, or the JPEG copy with its errors on that copy's test images (single crop / with flip)."""
    if entry.get("jpeg_test_error") is None:
        return "original images"
    return (
        f"JPEG copy (its test JPEGs: {100 * entry['jpeg_test_error']:.2f} / {100 * entry['jpeg_flip_test_error']:.2f})"
    )


def markdown_table(registry=None):
    """The zoo's table: every shipped CIFAR-10 network, its final error on the 10,000 original
    test images beside the published ones, what it trained on, its training hours and recipe,
    its file."""
    lines = [
        "| network | unit | parameters | test error % | with flip % | training-set error % | trained on | paper % "
        "| akamaster % | chenyaofo % | hours | hours alone (images/s) | recipe | file | sha256 |",
        "|---" * 15 + "|",
    ]
    for name, entry in in_table_order(registry):
        references = REFERENCES.get(depth_and_unit(name)[0], {})
        config = entry["config"]
        command = f"`{user_command(entry['command'], data_dir=False)}`" if entry.get("command") else ""
        flip = f"{100 * entry['flip_test_error']:.2f}" if entry.get("flip_test_error") is not None else ""
        training_set = f"{100 * entry['train_error']:.2f}" if entry.get("train_error") is not None else ""
        alone = (
            f"{entry['hours_alone']:.2f} ({entry['images_per_second_alone']:g})"
            if entry.get("hours_alone") is not None
            else ""
        )
        lines.append(
            f"| {name} | {UNIT_NAMES[depth_and_unit(name)[1]]} | "
            f"{entry['parameters'] / 1e6:.2f}M | **{100 * entry['test_error']:.2f}** | {flip} | {training_set} | "
            f"{trained_on(entry)} | "
            f"{paper_error(name)} | "
            f"{references.get('akamaster') or ''} | {references.get('chenyaofo') or ''} | "
            f"{entry['training_hours']:.1f} | {alone} | {command} ({config['duration']:g} {config['schedule_unit']}, "
            f"{config.get('schedule', 'step')}, {config.get('precision', 'float32')}) | {entry['bytes'] / 2**20:.1f} MB | "
            f"`{entry['sha256'][:12]}` |"
        )
    return "\n".join(lines)


# How each of the zoo page's curve images begins (its alt text's start), which the landing script finds them by.
CURVE_IMAGE_START = "![Test error and training loss of the zoo's"


def curve_images(registry=None):
    """The zoo page's figures, one per shipped network in the table's order: the curves
    `docs/zoo_<name>_curves.png` that scripts/land_zoo_run.py draws from its run's log."""
    images = []
    for name, _ in in_table_order(registry):
        depth, unit = depth_and_unit(name)
        images.append(
            f"{CURVE_IMAGE_START} {UNIT_NAMES[unit]} ResNet-{depth.removeprefix('resnet')}](zoo_{name}_curves.png)"
        )
    return "\n".join(images)


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


def same_recipe(first, second):
    """Whether two registry entries' networks were trained by the same recipe on the same data
    (every config field but the network and `NOT_RECIPE`'s, and the data they describe)."""

    def recipe_of(entry):
        return {field: value for field, value in entry["config"].items() if field not in NOT_RECIPE}, entry["data"]

    return recipe_of(first) == recipe_of(second)


def unit_comparison_table(registry=None):
    """Table 3 at the zoo's scale: each depth the zoo ships with both units trained by the same
    recipe, the original and the pre-activation network's final test errors (single crop and
    with the flip) and the pre-activation unit's gain, beside the paper's (a row that says so
    where there is no such depth)."""
    entries = (registry or pretrained.registry()).get("cifar10", {})
    lines = [
        "| network | original % | pre-activation % | gain (points) | with flip: original / pre-activation % "
        "| paper: original / pre-activation % | recipe |",
        "|---|---|---|---|---|---|---|",
    ]
    pairs = [
        (name, entries[name], entries[f"{name}_original"])
        for name in entries
        if f"{name}_original" in entries and same_recipe(entries[name], entries[f"{name}_original"])
    ]
    for name, preactivation, original in sorted(pairs, key=lambda pair: pair[1]["parameters"]):
        config = preactivation["config"]
        flips = (
            f"{100 * original['flip_test_error']:.2f} / {100 * preactivation['flip_test_error']:.2f}"
            if original.get("flip_test_error") is not None and preactivation.get("flip_test_error") is not None
            else ""
        )
        gain = 100 * (original["test_error"] - preactivation["test_error"])
        lines.append(
            f"| {name} | {100 * original['test_error']:.2f} | {100 * preactivation['test_error']:.2f} | {gain:+.2f} | "
            f"{flips} | {paper_error(f'{name}_original', True)} / {paper_error(name, True)} | "
            f"{config['duration']:g} {config['schedule_unit']}, {config.get('schedule', 'step')} |"
        )
    if not pairs:
        lines.append("| none yet: no depth is shipped with both units trained by one recipe | | | | | | |")
    return "\n".join(lines)


# What the zoo's networks train and are tested on, named by what it is (the networks trained
# on the JPEG copy before say so in their own entries).
DATA_DESCRIPTION = (
    "CIFAR-10 (Krizhevsky, 2009) with its original pixels, as PNG files in folders of a class each "
    "(`keras-preact data` makes them from cifar-10-python.tar.gz): 50,000 training and 10,000 test images"
)


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
# two of 10,000). Between precisions they differ by more: the original ResNet-56 trained
# in bfloat16 errs on 10.83 % of the test images in bfloat16 and on 10.97 % in float32.
AGREEMENT = 0.001
# Package data is kept small: at most 16 MB a shipped file.
MAXIMUM_BYTES = 16 * 2**20


def publish(run_dir, name, data_dir=None, weights_directory=None, registry_file=None, images_per_second=None):
    """Publishes the network of the finished run in `run_dir` as `name`'s CIFAR-10 weights.

    Args:
        run_dir: a finished run of `keras-preact train` on CIFAR-10 (all 50,000
            training images, tested on the test set).
        name: the network's name in `keras_preact.list_models()` ("resnet20", "resnet20_original", ...).
        data_dir: the run's data directory (CIFAR-10 image folders or tensorflow-datasets'),
            for the evaluation of the shipped file; the run's own by default.
        weights_directory, registry_file: where the files go (the package's by default).
        images_per_second: the network's training rate measured alone on the machine that
            trained it (`python bench/training_throughput.py`), where the run shared its
            cores: the entry then records the hours the run's images take at that rate
            (`hours_alone`) beside the run's own wall-clock `training_hours`.

    Returns:
        The registry entry.

    Raises:
        ValueError: for a run that is not a finished CIFAR-10 run of that network, or a
            shipped file whose test error disagrees with the run's.
        FileNotFoundError: for a missing run.
    """
    if images_per_second is not None and not (
        isinstance(images_per_second, (int, float)) and 0 < images_per_second < float("inf")
    ):
        raise ValueError(
            f"images_per_second must be a positive number. Received: images_per_second={images_per_second!r}"
        )
    summary = finished_run(run_dir)
    config = summary["config"]
    path, shipped = save_network(run_dir, name, weights_directory or pretrained.WEIGHTS_DIRECTORY)
    size = os.path.getsize(path)
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
    if abs(as_run["error"] - summary["test_error"]) > AGREEMENT:
        os.remove(path)
        raise ValueError(
            f"The shipped file's test error in the run's precision, {precision} ({100 * as_run['error']:.2f} %), "
            f"differs from the run's ({100 * summary['test_error']:.2f} %): the network or its preprocessing is not "
            f"the run's."
        )
    training_set = evaluate.evaluate(name, path, config["dataset"], data_dir, split="train")
    entry = dict(
        file=os.path.basename(path),
        sha256=checksums.sha256(path),
        bytes=size,
        parameters=sum(int(np.prod(weight.shape)) for weight in shipped.trainable_weights),
        test_error=round(result["error"], 6),
        flip_test_error=round(result["flip_error"], 6),
        train_error=round(training_set["error"], 6),
        per_class_accuracy={label: round(value, 4) for label, value in result["per_class_accuracy"].items()},
        data=DATA_DESCRIPTION,
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
    register(registry_file or pretrained.REGISTRY_FILE, name, entry)
    return entry


def finished_run(run_dir):
    """The summary of the finished CIFAR-10 run in `run_dir`, checked to be one the zoo publishes.

    Raises:
        FileNotFoundError: for a missing run.
        ValueError: for a run that held out a validation split, used a subset, or is not CIFAR-10.
    """
    summary_path = os.path.join(run_dir, "summary.json")
    if not os.path.isfile(summary_path):
        raise FileNotFoundError(
            f"run_dir must be a finished training run (with summary.json). Received: run_dir={run_dir!r}"
        )
    summary = files.read_json(summary_path, "train the run again, or restore the file")
    config = summary["config"]
    problems = []
    if summary.get("evaluated_on", "test") != "test" or config.get("validation_examples") is not None:
        problems.append("it held out a validation split (zoo networks train on the whole training set)")
    if config.get("train_examples") is not None or config.get("test_examples") is not None:
        problems.append("it used a subset of the data")
    if summary["class_names"] != list(pretrained.CIFAR10_CLASSES) or tuple(summary["image_shape"]) != (32, 32, 3):
        problems.append("its data set is not CIFAR-10")
    if problems:
        raise ValueError(
            f"Only finished CIFAR-10 runs are published; {run_dir} is not: {'; '.join(problems)}. "
            f"Received: run_dir={run_dir!r}"
        )
    return summary


def save_network(run_dir, name, weights_directory):
    """(path, network) of the run's network saved as `weights_directory/cifar10_<name>.weights.h5`,
    its units as separate layers, whatever layout it trained in.

    Raises:
        ValueError: where `name` is not the run's network, or the file passes `MAXIMUM_BYTES`.
    """
    network = keras.saving.load_model(os.path.join(run_dir, "model.keras")).layers[-1]
    if network.name != name or name not in keras_preact.MODELS:
        raise ValueError(
            f"name must be the run's network, {network.name!r}, a name of keras_preact.list_models(). "
            f"Received: name={name!r}"
        )
    shipped = keras_preact.get_model(name, classes=len(pretrained.CIFAR10_CLASSES))
    keras_preact.copy_weights(network, shipped)
    os.makedirs(weights_directory, exist_ok=True)
    path = os.path.join(weights_directory, f"cifar10_{name}.weights.h5")
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


def register(registry_file, name, entry):
    """Writes `entry` as `name`'s CIFAR-10 entry of the registry file."""
    registry = {}
    if os.path.isfile(registry_file):
        registry = files.read_json(registry_file, "restore it from the repository (git checkout)")
    registry.setdefault("cifar10", {})[name] = entry
    with open(registry_file, "w") as file:
        json.dump(registry, file, indent=2, sort_keys=True)
        file.write("\n")


def _tensorflow_version():
    import tensorflow as tf

    return tf.__version__
