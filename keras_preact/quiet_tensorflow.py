"""TensorFlow loaded without the lines its libraries print while they load.

Loading TensorFlow prints absl's "All log messages before absl::InitializeLog()", oneDNN's
and the CUDA probe's notices, and, on a machine without a GPU, an `E0000 ... failed call to
cuInit` line at its first device query: lines a user of keras_preact reads as errors, which
no log level silences once TensorFlow is loaded. Where keras_preact is imported before
TensorFlow, the load and the first device query write their standard error to a temporary
file that is shown only if the load fails, and the C++ logs' informational lines (XLA's
compilation notices) are off (`TF_CPP_MIN_LOG_LEVEL=1`: warnings and errors stay). Where
TensorFlow was loaded first, the device query alone is held. A process that sets
`TF_CPP_MIN_LOG_LEVEL` before TensorFlow loads chooses TensorFlow's lines itself and is left
alone (TensorFlow sets it to 1 as it loads; 0 shows the device query's lines too).
"""

import contextlib
import importlib.abc
import importlib.util
import os
import sys
import tempfile


@contextlib.contextmanager
def standard_error_held():
    """File descriptor 2 goes to a temporary file in the block; what was written there is
    written to standard error again only if the block raises."""
    sys.stderr.flush()
    standard_error = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(standard_error, 2)
            held.seek(0)
            sys.stderr.buffer.write(held.read())
            sys.stderr.flush()
            raise
        finally:
            os.dup2(standard_error, 2)
            os.close(standard_error)


def load_quietly():
    """Imports TensorFlow now, as the finder loads it (see above), whatever the log level."""
    if "tensorflow" not in sys.modules and not any(isinstance(finder, _QuietFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietFinder())
    import tensorflow

    return tensorflow


def find_devices_quietly():
    """Where TensorFlow is loaded, its devices found (the CUDA probe's lines held, unless
    TF_CPP_MIN_LOG_LEVEL is 0); a query after the first prints nothing and costs nothing."""
    tensorflow = sys.modules.get("tensorflow")
    if tensorflow is None:
        return
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0":
        tensorflow.config.list_physical_devices()
        return
    with standard_error_held():
        tensorflow.config.list_physical_devices()


class _QuietLoader(importlib.abc.Loader):
    """TensorFlow's own loader, run with standard error held; the module keeps that loader."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self.loader
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        with standard_error_held():
            self.loader.exec_module(module)
            module.config.list_physical_devices()


class _QuietFinder(importlib.abc.MetaPathFinder):
    """Finds `tensorflow` as the other finders do, once, and loads it quietly."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        uninstall()
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


def install():
    """From now on, the first `import tensorflow` (Keras' included) is quiet, unless
    TensorFlow is loaded already or `TF_CPP_MIN_LOG_LEVEL` is set."""
    if "tensorflow" in sys.modules or "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        return
    if not any(isinstance(finder, _QuietFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietFinder())


def uninstall():
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _QuietFinder)]
