"""`keras-preact`'s entry point: `main` parses the command line (`commands.parser`), checks what
the command checks before TensorFlow loads, imports TensorFlow where the command needs it
(`tensorflow_import`), checks Keras' backend and runs the command's module (`commands`). An
error ends it with one line and its exit code (`failures`), Ctrl-C with one line and 130."""

import shlex
import sys

from . import commands
from .failures import INTERRUPTED, exit_code
from .tensorflow_import import import_tensorflow


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
