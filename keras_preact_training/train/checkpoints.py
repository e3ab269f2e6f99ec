"""A run's checkpoints: every variable of the training model and its optimizer, by name, as
NumPy arrays in one `.npz` file a checkpoint (`checkpoints/ckpt-<step>.npz`).

One format for every backend (TensorFlow, JAX, PyTorch) and every input pipeline, read and
written with NumPy alone: a run started under one resumes under another, on a machine with
or without TensorFlow. Each file is written whole under a temporary name and then renamed,
so a crash leaves the checkpoint before it intact; the newest KEEP are kept. Runs started
before this format wrote TensorFlow's (`ckpt-<step>.index` and `.data-*`): where TensorFlow
is installed they resume from those (`tf.train.load_checkpoint`), and write `.npz` on.
"""

import os
import re
import zipfile

import numpy as np

from ..failures import CheckpointsUnreadable
from . import averaging

# Checkpoints kept in a run's folder, the newest.
KEEP = 3
FORMATS = {"npz": re.compile(r"ckpt-(\d+)\.npz"), "tensorflow": re.compile(r"ckpt-(\d+)\.index")}
# Integers are 64-bit in a checkpoint, as TensorFlow keeps them, so that every backend
# resumes a run of the others: JAX (without x64) keeps the optimizer's step count as int32
# and Keras' seed generators their state as uint32.
CHECKPOINT_DTYPES = {"int32": "int64", "uint32": "int64"}


def variables_by_key(model, optimizer, average=()):
    """Every variable of `model` and `optimizer`, by the key it has in a checkpoint:
    "model/<index>:<path>" and "optimizer/<index>:<path>", and those of `average` (the weights'
    equal average, `averaging.EqualAverage.variables`, where the run keeps one):
    "swa/<index>:<path>".

    `model.variables`, not `model.weights`: the augmentation's random state is a variable
    but not a weight, and a resumed run must draw the same crops and flips. Paths need not
    be unique (every seed generator's is "seed_generator/..."): they are numbered.
    """
    parts = (("model", model.variables), ("optimizer", optimizer.variables), (averaging.CHECKPOINT_PART, average))
    return {
        f"{part}/{index}:{variable.path.replace('/', '.')}": variable
        for part, variables in parts
        for index, variable in enumerate(variables)
    }


def state(model, optimizer, average=()):
    """{key: NumPy array} of every variable of `model`, `optimizer` and `average` (`variables_by_key`)."""
    values = {}
    for key, variable in variables_by_key(model, optimizer, average).items():
        value = np.asarray(variable)
        values[key] = value.astype(CHECKPOINT_DTYPES.get(value.dtype.name, value.dtype))
    return values


def load(model, optimizer, values, average=()):
    """Assigns `values` (`state`'s, or `read`'s of a checkpoint) to the variables of `model`,
    `optimizer` and `average`; an average the values lack (`read`) keeps its variables'."""
    for key, variable in variables_by_key(model, optimizer, average).items():
        if key in values:
            variable.assign(np.asarray(values[key]).astype(variable.dtype))


def save(directory, step, values):
    """Writes `values` as `directory/ckpt-<step>.npz`, whole or not at all, and deletes all
    but the newest KEEP checkpoints; returns the path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"ckpt-{step}.npz")
    partial = path + ".partial"
    with open(partial, "wb") as file:
        np.savez(file, **values)
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)
    for older in sorted(steps(directory, "npz"))[:-KEEP]:
        os.remove(os.path.join(directory, f"ckpt-{older}.npz"))
    return path


def steps(directory, kind="npz"):
    """The steps of the checkpoints of format `kind` ("npz" or "tensorflow") in `directory`."""
    names = os.listdir(directory) if os.path.isdir(directory) else []
    return [int(match.group(1)) for match in map(FORMATS[kind].fullmatch, names) if match]


def newest_first(directory):
    """[(step, path)] of the checkpoints of `directory`, .npz and TensorFlow's (a prefix), newest first."""
    return sorted(
        [(step, os.path.join(directory, f"ckpt-{step}.npz")) for step in steps(directory, "npz")]
        + [(step, os.path.join(directory, f"ckpt-{step}")) for step in steps(directory, "tensorflow")],
        reverse=True,
    )


def read_values(path):
    """{key: NumPy array} of the checkpoint `path`: a `.npz` file, or a TensorFlow prefix.

    Raises:
        ValueError: if it does not read.
    """
    if not path.endswith(".npz"):
        return read_tensorflow(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as error:
        raise ValueError(f"{type(error).__name__}: {error}") from None


def read(path, expected):
    """The values of the checkpoint `path` for the keys of `expected` ({key: variable}).

    The weights' equal average (keys "swa/...") is read where both the checkpoint and
    `expected` have one, else left out: a run that keeps an average reads a checkpoint
    written before it kept one (`--allow-config-changes`) and begins its average empty, and
    a run that keeps none ignores a checkpoint's.

    Raises:
        ValueError: if the file is damaged, lacks a key or holds one more, or a value's
            shape differs from its variable's.
    """
    values = read_values(path)
    prefix = f"{averaging.CHECKPOINT_PART}/"
    if not (any(key.startswith(prefix) for key in values) and any(key.startswith(prefix) for key in expected)):
        values = {key: value for key, value in values.items() if not key.startswith(prefix)}
        expected = {key: variable for key, variable in expected.items() if not key.startswith(prefix)}
    missing, extra = sorted(set(expected) - set(values)), sorted(set(values) - set(expected))
    if missing or extra:
        raise ValueError(f"it holds other variables than the network's: missing {missing[:3]}, extra {extra[:3]}")
    for key, variable in expected.items():
        if tuple(values[key].shape) != tuple(variable.shape):
            raise ValueError(f"{key} has shape {tuple(values[key].shape)}, the network's {tuple(variable.shape)}")
    return values


def read_tensorflow(prefix):
    """The values of a checkpoint in TensorFlow's format (a `tf.train.Checkpoint` of
    {"model": {key: variable}, "optimizer": {...}}) by `variables_by_key`'s keys, read with
    `tf.train.load_checkpoint`.

    Raises:
        ValueError: where TensorFlow is not installed, or the checkpoint does not read.
    """
    try:
        import tensorflow as tf
    except ImportError:
        raise ValueError(
            "it is in TensorFlow's format, which needs TensorFlow to read: resume once where "
            "TensorFlow is installed, and the run writes .npz checkpoints from then on"
        ) from None
    suffix = "/.ATTRIBUTES/VARIABLE_VALUE"
    try:
        reader = tf.train.load_checkpoint(prefix)
        return {
            f"{name.partition('/')[0]}/{unescape(name.partition('/')[2][: -len(suffix)])}": reader.get_tensor(name)
            for name in reader.get_variable_to_shape_map()
            if name.endswith(suffix) and name.partition("/")[0] in ("model", "optimizer")
        }
    except Exception as error:
        raise ValueError(f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:200]}") from None


def unescape(name):
    """A dictionary key as `tf.train.Checkpoint` names it in its object graph ("." written
    "..", "/" written ".S"), as the key."""
    return re.sub(r"\.(.)", lambda match: "/" if match.group(1) == "S" else match.group(1), name)


def restore_newest_intact(directory, model, optimizer, verbose=True, average=()):
    """Restores into `model`, `optimizer` and `average` (the weights' equal average's
    variables, where the run keeps one) the newest checkpoint of `directory` that reads back
    whole; returns its path, or None where there is none (a new run).

    The checkpoints are found from their files, not from an index that a crash or a careless
    edit can leave wrong. A truncated or deleted newest checkpoint is skipped with a message,
    and the one before it is used: the steps since are trained again, nothing else is lost.

    Raises:
        CheckpointsUnreadable: if there are checkpoints and none of them can be restored.
    """
    expected = variables_by_key(model, optimizer, average)
    failures = []
    for _, path in newest_first(directory):
        try:
            values = read(path, expected)
        except ValueError as error:
            failures.append(f"{path}: {str(error)[:300]}")
            if verbose:
                print(f"Checkpoint {path} cannot be restored ({failures[-1]}); trying the one before it.")
            continue
        load(model, optimizer, values, average)
        return path
    if failures:
        raise CheckpointsUnreadable(
            f"No checkpoint in {directory} can be restored (truncated or corrupt files): "
            + "; ".join(failures)
            + ". Move the run directory away to train from the start."
        )
    return None
