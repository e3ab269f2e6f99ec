"""How a command fails: the errors the training loop, its checkpoints and its processes raise,
and the exit code and one line each becomes (`exit_code`). Bad input exits with 2, a diverged
run with 3, a run whose checkpoints are all unreadable with 4, a process of a data-parallel run
whose peer ended with 5; Ctrl-C with 130, as a shell reports SIGINT. Every module may raise
them: this one imports nothing of the package."""

import os
import sys


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


class CheckpointsUnreadable(RuntimeError):
    """A run directory holds checkpoints and none of them can be restored."""


class PeerLost(RuntimeError):
    """Another process of a multi-process run ended: this one cannot go on."""


# A command ended by Ctrl-C (SIGINT) exits as a shell reports it: 128 + 2.
INTERRUPTED = 130
PEER_LOST = 5
EXIT_CODES = {
    ValueError: 2,
    # Files and folders that are missing, in the way or unreadable; servers that do not answer.
    OSError: 2,
    ImportError: 2,
    TrainingDiverged: 3,
    CheckpointsUnreadable: 4,
}


def exit_code(error):
    """The exit code of an error a command raised, its message printed in one line (`EXIT_CODES`);
    a lost peer ends the process at once with 5; anything else is a bug, raised with its traceback."""
    if isinstance(error, PeerLost):
        print(f"error: {error}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(PEER_LOST)  # at once: at a normal exit JAX's distributed runtime waits out its heartbeat, then aborts
    code = next((code for kind, code in EXIT_CODES.items() if isinstance(error, kind)), None)
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
