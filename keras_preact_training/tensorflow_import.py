"""How the commands import TensorFlow: quietly, with oneDNN's kernels on every processor, and
only where a command needs it (cli.main for most; `serve` once it knows its runtime)."""

import importlib.util
import os

from keras_preact import quiet_tensorflow


def import_tensorflow(verbose, optional=False, onednn=True):
    """Imports TensorFlow, quietly unless `verbose`: its C++ log lines below FATAL are off
    (`TF_CPP_MIN_LOG_LEVEL=3`, unless set), and the lines its libraries write while they load
    and find their devices (CUDA probing, oneDNN notices, which no log level silences) are held
    and shown only if the import fails (keras_preact.quiet_tensorflow). `optional`: where
    TensorFlow is not installed, nothing happens (the command runs without it or says why it
    cannot). `onednn`: with oneDNN's kernels on every processor (`use_onednn`); False leaves
    them to TensorFlow's default."""
    if onednn:
        use_onednn()
    if optional and not tensorflow_installed():
        return
    if verbose:
        quiet_tensorflow.uninstall()
        import tensorflow  # noqa: F401

        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    quiet_tensorflow.load_quietly()


def use_onednn():
    """TensorFlow's oneDNN kernels, unless `TF_ENABLE_ONEDNN_OPTS` says otherwise. TensorFlow turns
    them on by itself only on processors with instructions for neural networks (AVX-512 VNNI,
    bfloat16, AMX; TensorFlow 2.9's release notes); on an AMD EPYC with AVX2 alone they train
    ResNet-110 in float32 2.1 times as fast (73.9 images/s against 34.8; docs/benchmarks.md,
    "A processor with AVX2 alone"). Takes effect only before TensorFlow loads;
    `TF_ENABLE_ONEDNN_OPTS=0` keeps TensorFlow's own kernels."""
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")


def tensorflow_installed():
    """Whether TensorFlow is installed (found by the import system, not imported)."""
    return importlib.util.find_spec("tensorflow") is not None
