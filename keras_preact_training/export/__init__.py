"""Export: a trained network as a TF Serving version folder, its SavedModel with three
signatures beside ONNX and LiteRT models (float32, float16, int8), and the contract both
serving runtimes read it by (`contract`).

A format is one module of this package that registers itself in `FORMATS` (`register`): its
name, its precisions, what writes its files into a version folder, the files a version is
complete with, the runtime that serves it and what it needs installed. `--format`'s
choices, the precisions `--quantize` offers, the files `serve` looks for and every message
about formats are read from that table. A new format is one module and its import at the
end of this file; its module imports nothing heavy at its top (this package is imported by
the onnxruntime server, which imports neither TensorFlow nor Keras).

Imports `train`, `data` and the package's base modules; `serving` imports it. The public
functions of `versions` load on first use (PEP 562)."""

import dataclasses
import importlib
import typing

# The folder of exported models (TF Serving's layout under it), and how many classes each
# prediction lists.
DEFAULT_DIRECTORY = "saved_models"
DEFAULT_TOP_K = 5
# `--format`'s name of every format together.
EVERY = "all"


@dataclasses.dataclass(frozen=True)
class Format:
    """One export format.

    Attributes:
        name: `--format`'s name of it.
        title: what lists of formats call it ("a SavedModel", "ONNX").
        files_name: what messages call its files ("a SavedModel", "ONNX models").
        precisions: the precisions it is written in, float32 first (the others on request,
            `export --quantize`).
        write: `write(version)` writes its files into `version.path` (an `export.versions.Version`)
            and returns what metadata.json records of them ({} for nothing).
        needed: `needed(precision)` -> the files (relative to a version folder) with which a
            version holds it complete in `precision`, the first naming it in messages.
        written: `written(metadata)` -> the files of it that a version's metadata.json records.
        runtime: the `serve --runtime` that serves it, or None.
        require: `require()` raises an ImportError naming the extra to install where a
            package it needs is missing.
        package_versions: `package_versions()` -> {package: version} of what wrote and checked it.
        checked_by: what checked each written file against the network, for messages.
        in_all: whether `--format all` writes it (the formats a server or a device runs).
        folded: whether it exports the network with its BatchNorms folded (where asked).
    """

    name: str
    title: str
    files_name: str
    precisions: tuple
    write: typing.Callable
    needed: typing.Callable
    written: typing.Callable
    runtime: str = None
    require: typing.Callable = lambda: None
    package_versions: typing.Callable = dict
    checked_by: str = ""
    in_all: bool = True
    folded: bool = True


# Every format by name, in the order written into a version folder (the SavedModel first: it
# makes the folder).
FORMATS = {}


def register(format):
    """Adds `format` to `FORMATS`; returns it."""
    FORMATS[format.name] = format
    return format


# Each format registers itself as its module is imported, in this order (FORMATS's).
# isort: off
from . import saved_model  # noqa: E402, F401
from . import onnx_models  # noqa: E402, F401
from . import litert  # noqa: E402, F401
from . import kerashub  # noqa: E402, F401

# isort: on


def format_names():
    """`--format`'s choices: every format, then `EVERY`; the first is the default."""
    return (*FORMATS, EVERY)


def chosen(name):
    """The formats `--format name` writes."""
    return tuple(exported.name for exported in FORMATS.values() if exported.in_all) if name == EVERY else (name,)


def quantized_precisions():
    """The precisions some format writes beside float32 (`--quantize`'s choices)."""
    return tuple(sorted({precision for format in FORMATS.values() for precision in format.precisions[1:]}))


__all__ = [
    "DEFAULT_TOP_K",
    "FORMATS",
    "Preprocessing",
    "classify",
    "export_run",
    "export_saved_model",
    "export_shipped",
    "read_image_files",
]
PUBLIC = {
    "Preprocessing": "contract",
    "classify": "saved_model",
    "read_image_files": "saved_model",
    "export_run": "sources",
    "export_saved_model": "versions",
    "export_shipped": "sources",
}


def __getattr__(name):
    # By name, on first use: `versions` and `saved_model`'s functions import TensorFlow, which the
    # onnxruntime server, importing this package, never loads.
    if name in PUBLIC:
        return getattr(importlib.import_module(f"{__name__}.{PUBLIC[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
