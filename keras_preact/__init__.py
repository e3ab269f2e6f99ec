"""keras-preact: the pre-activation residual networks of He et al. (ECCV 2016) in Keras 3.

Reference:
    He, Zhang, Ren, Sun. "Identity Mappings in Deep Residual Networks", ECCV 2016.
    https://arxiv.org/abs/1603.05027
"""

import importlib

import wrapt

from keras_preact import quiet_tensorflow

# The public names and the module each lives in, imported on first use (PEP 562): importing
# keras_preact, or a light module such as `keras_preact.defaults`, imports neither Keras nor
# its backend until a layer or network is asked for (`keras-preact --help` answers at
# once).
_SUBMODULES = (
    "analysis",
    "architectures",
    "base_layers",
    "defaults",
    "folding",
    "hub",
    "layouts",
    "merges",
    "models",
    "pretrained",
    "quiet_tensorflow",
    "shortcuts",
    "stacked",
    "units",
    "walks",
)
_NAMES = {
    "architectures": ("ARCHITECTURES", "Architecture"),
    "folding": ("fold_batch_norms",),
    "merges": ("Addition", "ConstantScaling", "ExclusiveGating", "NoShortcut", "ShortcutDropout", "ShortcutOnlyGating"),
    "models": (
        "MODELS",
        "CifarResNet",
        "ResNet",
        "ResNet18",
        "ResNet20",
        "ResNet32",
        "ResNet34",
        "ResNet44",
        "ResNet50",
        "ResNet56",
        "ResNet101",
        "ResNet110",
        "ResNet110OneLayer",
        "ResNet152",
        "ResNet164",
        "ResNet200",
        "ResNet1001",
        "ResNet1202",
        "get_model",
        "list_models",
    ),
    "layouts": ("copy_weights", "separate_units"),
    "pretrained": ("decode_predictions", "preprocess_input"),
    "stacked": ("StackedUnits",),
    "units": (
        "BatchNormAfterAdditionUnit",
        "OriginalUnit",
        "PreActivationUnit",
        "ReLUBeforeAdditionUnit",
        "ReLUOnlyPreActivationUnit",
    ),
}
_MODULE_OF = {name: module for module, names in _NAMES.items() for name in names}

__all__ = sorted(_MODULE_OF) + list(_SUBMODULES)
__version__ = "0.1.0"


quiet_tensorflow.install()


def __getattr__(name):
    # By name, on first use: `import keras_preact` imports neither Keras nor TensorFlow, so that the
    # onnxruntime server and the commands that need neither stay without them.
    if name in _MODULE_OF:
        value = getattr(importlib.import_module(f"keras_preact.{_MODULE_OF[name]}"), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"keras_preact.{name}")
    else:
        raise AttributeError(f"module 'keras_preact' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


@wrapt.when_imported("keras_hub")
def _register_hub_models(_):
    """Once KerasHub is imported (now, if it was before keras_preact), keras-preact's KerasHub
    classes register with Keras, so that `from_preset` loads a preset of a keras-preact
    network (`keras_preact.hub`)."""
    from . import hub  # noqa: F401


@wrapt.when_imported("keras")
def _register_layers(_):
    """Once Keras is imported (now, if it was before keras_preact), the layers register with it,
    so that `keras.saving.load_model` finds them in a process that never named one. Keras on
    TensorFlow loaded before keras_preact finds its devices now, its CUDA probe's lines held."""
    quiet_tensorflow.find_devices_quietly()
    from . import models  # noqa: F401
