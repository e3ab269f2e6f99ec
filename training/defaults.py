"""The command line's defaults, each in its one home here.

This module imports nothing heavy, so that `keras-preact --help`, `configs` and
argument errors answer without importing TensorFlow; the modules that use each value
import it from here (`export.DEFAULT_TOP_K` is this `DEFAULT_TOP_K`).
"""

# export: the folder of exported models (TF Serving's layout under it), and how many
# classes each prediction lists.
DEFAULT_DIRECTORY = "saved_models"
DEFAULT_TOP_K = 5
EXPORT_FORMATS = ("saved_model", "onnx", "litert", "all")  # the first is the default
# What installs ONNX export and the onnxruntime server; what installs LiteRT's interpreter.
ONNX_EXTRA = 'pip install "keras-preact[onnx]"'
LITERT_EXTRA = 'pip install "keras-preact[litert]"'
# serve: TF Serving's REST port, the most instances one request may hold, the most
# :predict requests in flight at once (past it: 503), the seconds a request has to arrive
# whole (past it: 408), and the mebibytes of request bodies held at once (past it: 503). A
# body costs the server about 2.5 times its size until it is answered (16 concurrent 60 MB
# bodies of numbers added 2.1-2.6 GB to the server, the hostile-input battery on 9efa15e), so
# 256 MiB of bodies keep a 4 GB, 2-core server within its memory.
DEFAULT_PORT = 8501
DEFAULT_MAX_BATCH = 64
DEFAULT_MAX_IN_FLIGHT = 256
DEFAULT_REQUEST_TIMEOUT = 10.0
DEFAULT_MAX_BODY_MEMORY = 256
# evaluate: images per inference batch, a memory bound only (results do not depend on it).
EVALUATION_BATCH_SIZE = 500
# evaluate: the splits it measures, each with the name its report gives the error.
EVALUATION_SPLITS = {"test": "test", "train": "training-set"}
# tune: the gatings of Table 1 searched, the keras-tuner tuners offered, and the training
# images held out for the search's objective.
GATINGS = ("exclusive_gating", "shortcut_only_gating")
TUNER_NAMES = ("grid", "random", "hyperband")
DEFAULT_VALIDATION_EXAMPLES = 5000
