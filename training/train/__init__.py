"""Training: the configs (every knob of a run), the paper's recipe as Keras objects, the loop
and the step engines of each backend (tf.distribute, JAX with Keras' data parallelism,
PyTorch), the checkpoints, the precision a run computes in, and evaluation of a trained
network.

Imports `data` and the package's `files`, `plots` and `defaults`; nothing above."""
