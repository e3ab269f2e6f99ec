"""Export: a trained network as a TF Serving version folder, its SavedModel with three
signatures beside ONNX and LiteRT models (float32, float16, int8), and the contract both
serving runtimes read it by (`contract`).

Imports `train`, `data` and the package's base modules; `serving` imports it. The public
functions below load on first use (PEP 562), so that `contract`, which imports no
TensorFlow or Keras, can be imported alone."""

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


def __getattr__(name):
    if name in __all__:
        from . import versions

        return getattr(versions, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
