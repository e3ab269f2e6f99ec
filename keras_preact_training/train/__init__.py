"""Training: the configs (every knob of a run), the paper's recipe as Keras objects, the loop
and the step engines of each backend (tf.distribute, JAX with Keras' data parallelism,
PyTorch), the checkpoints, the precision a run computes in, and evaluation of a trained
network.

Imports `data` and the package's `files` and `plots`; nothing above."""

# evaluate: images per inference batch, a memory bound only (results do not depend on it).
EVALUATION_BATCH_SIZE = 500
# evaluate: the splits it measures, each with the name its report gives the error.
EVALUATION_SPLITS = {"test": "test", "train": "training-set"}
