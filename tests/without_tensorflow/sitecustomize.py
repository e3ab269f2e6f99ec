"""On PYTHONPATH, hides TensorFlow (and its packages) from the import system as where it is not
installed: `import tensorflow` fails with ModuleNotFoundError and `importlib.util.find_spec`
finds nothing. The tests of training without TensorFlow run their commands in such a process."""

import importlib.machinery
import sys

HIDDEN = ("tensorflow", "tensorflow_datasets", "tf_keras", "tf2onnx", "tensorboard")


class WithoutTensorFlow:
    """Python's path finder, blind to HIDDEN."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        return importlib.machinery.PathFinder.find_spec(name, path, target)

    @staticmethod
    def invalidate_caches():
        importlib.machinery.PathFinder.invalidate_caches()


sys.meta_path[:] = [
    WithoutTensorFlow if finder is importlib.machinery.PathFinder else finder for finder in sys.meta_path
]
