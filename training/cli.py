"""`keras-preact`'s entry point: `main` parses the command line (`commands.parser`), checks what
the command checks before TensorFlow loads, imports TensorFlow where the command needs it,
checks Keras' backend and runs the command's module (`commands`). Bad input exits with 2, a
diverged run with 3, a run whose checkpoints are all unreadable with 4, a process of a
data-parallel run whose peer ended with 5, each with one line that says why; Ctrl-C ends any
command with one line and 130, as a shell reports SIGINT."""

import os
import shlex
import sys

from keras_preact import quiet_tensorflow

from . import commands


def main(argv=None):
    arguments = commands.parser().parse_args(argv)
    command = commands.command(arguments.command)
    try:
        if hasattr(command, "check"):
            command.check(arguments)
        if command.TENSORFLOW != "never":
            import_tensorflow(arguments.verbose, optional=command.TENSORFLOW == "optional")
        if command.BACKENDS is not None:
            check_backend(arguments.command, command.BACKENDS)
        arguments.command_line = "keras-preact " + shlex.join(sys.argv[1:] if argv is None else argv)
        return command.run(arguments)
    except Exception as error:
        return exit_code(error)
    except KeyboardInterrupt:
        sys.stdout.flush()
        what = command.interrupted(arguments) if hasattr(command, "interrupted") else ""
        print(f"\nInterrupted (Ctrl-C){what}.", file=sys.stderr, flush=True)
        return INTERRUPTED


# A command ended by Ctrl-C (SIGINT) exits as a shell reports it: 128 + 2.
INTERRUPTED = 130


def exit_code(error):
    """The exit code of an error a command raised, its message printed in one line: 2 for bad
    input, 3 for a diverged run, 4 for unreadable checkpoints, 5 (at once) for a data-parallel
    run that lost a process; anything else is a bug, raised with its traceback. Only a command
    that trains has imported the loop, the checkpoints and data parallelism."""
    loop = sys.modules.get(f"{__package__}.train.loop")
    checkpoints = sys.modules.get(f"{__package__}.train.checkpoints")
    data_parallel = sys.modules.get(f"{__package__}.train.data_parallel")
    if data_parallel and isinstance(error, data_parallel.PeerLost):
        print(f"error: {error}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(5)  # at once: at a normal exit JAX's distributed runtime waits out its heartbeat, then aborts
    exit_codes = {
        ValueError: 2,
        # Files and folders that are missing, in the way or unreadable; servers that do not answer.
        OSError: 2,
        ImportError: 2,
        **({loop.TrainingDiverged: 3} if loop else {}),
        **({checkpoints.CheckpointsUnreadable: 4} if checkpoints else {}),
    }
    code = next((code for kind, code in exit_codes.items() if isinstance(error, kind)), None)
    if code is None:
        raise error
    if isinstance(error, ModuleNotFoundError) and error.name == "tensorflow":
        error = (
            f"TensorFlow, Keras' backend here (KERAS_BACKEND={os.environ.get('KERAS_BACKEND', 'unset')}), "
            "is not installed. Install it (pip install 'keras-preact[tensorflow]'), or set "
            "KERAS_BACKEND=jax or torch: train and evaluate run there without it."
        )
    print(f"error: {error}", file=sys.stderr)
    return code


def check_backend(command, backends):
    """Raises ValueError where Keras runs on a backend that `command` does not run on."""
    import keras

    if keras.backend.backend() in backends:
        return
    if "jax" in backends:
        raise ValueError(
            f"keras-preact {command} runs on Keras' TensorFlow backend (tf.distribute) or on JAX (one device). "
            f"Received: KERAS_BACKEND={keras.backend.backend()}. Set KERAS_BACKEND=tensorflow or jax (on a GPU: "
            f"TensorFlow's CUDA build, pip install 'keras-preact[gpu]', or JAX's, pip install 'jax[cuda12]'); "
            f"train, evaluate and the model functions run on every backend."
        )
    raise ValueError(
        f"keras-preact {command} runs on Keras' TensorFlow backend (tf.distribute, SavedModels). Received: "
        f"KERAS_BACKEND={keras.backend.backend()}. Unset KERAS_BACKEND (on a GPU: pip install "
        f"'keras-preact[gpu]', TensorFlow's CUDA build); ablate runs on JAX too, and train, evaluate and the "
        f"model functions on every backend."
    )


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
    if optional:
        from .data import datasets

        if not datasets.tensorflow_installed():
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
