"""Data: CIFAR-10's image folder and the archives that make it, the data sets a run reads
(their splits, held-out and subset parts, the order of examples), the two input pipelines
that read them into batches (tf.data's and NumPy's), and the one decoder of encoded images
that training, calibration and the onnxruntime server share.

Imports nothing above it in the package but `files` and `plots`."""
