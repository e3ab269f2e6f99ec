"""Training, under tf.distribute, with the paper's recipe: `keras-preact --help`."""
