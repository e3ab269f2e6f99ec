"""Training, under tf.distribute, with the paper's recipe: `python -m training --help`."""
