"""The equal average of a network's weights over its run's last epochs: stochastic weight
averaging (Izmailov et al., "Averaging Weights Leads to Wider Optima and Better
Generalization", 2018, Algorithm 1), with the run's own schedule in place of the paper's
cyclical or constant rate, and one snapshot at each epoch's end.

The average lives in Keras variables of its own, outside the network and its optimizer: the
training steps never read it (a run's steps are the same with it and without it), a checkpoint
keeps it beside them (`checkpoints.state`), and a resumed run goes on with it.
"""

import keras
import numpy as np

# The part of a checkpoint's keys that holds the average (`checkpoints.variables_by_key`).
CHECKPOINT_PART = "swa"


class EqualAverage:
    """The mean of a network's trainable weights at the end of each epoch from `start_step`
    on, and at the run's last step.

    Args:
        weights: the network's trainable variables (their shapes; the average is float32).
        start_step: the first step whose end may be averaged.
        steps_per_epoch: the run's steps per epoch.
        total_steps: the run's last step, always averaged.
    """

    def __init__(self, weights, start_step, steps_per_epoch, total_steps):
        self.start_step, self.steps_per_epoch, self.total_steps = start_step, steps_per_epoch, total_steps
        self.means = [
            keras.Variable(np.zeros(weight.shape, "float32"), trainable=False, name=f"swa_{index}")
            for index, weight in enumerate(weights)
        ]
        self.count = keras.Variable(0, dtype="int32", trainable=False, name="swa_count")

    @classmethod
    def of_run(cls, config, weights, steps_per_epoch, total_steps):
        """The average `config.swa_start` asks for (None where it is 0): from the first step
        at or past that fraction of `total_steps`."""
        if not config.swa_start:
            return None
        return cls(weights, int(np.ceil(config.swa_start * total_steps)), steps_per_epoch, total_steps)

    @property
    def variables(self):
        """Every variable of the average, as a checkpoint keeps them: the means, then the count."""
        return [*self.means, self.count]

    @property
    def snapshots(self):
        """How many networks the average holds."""
        return int(keras.ops.convert_to_numpy(self.count))

    def due(self, step):
        """Whether the weights after `step` (counted from 1) join the average."""
        return step >= self.start_step and (step % self.steps_per_epoch == 0 or step == self.total_steps)

    def add(self, weights):
        """Adds the values of `weights` (the network's trainable variables) to the average:
        mean <- mean + (w - mean) / (n + 1)."""
        count = self.snapshots
        for mean, weight in zip(self.means, weights, strict=True):
            value = np.asarray(mean)
            mean.assign(value + (np.asarray(weight, "float32") - value) / (count + 1))
        self.count.assign(count + 1)

    def assign_to(self, weights):
        """Puts the average into `weights` (the network's trainable variables)."""
        for mean, weight in zip(self.means, weights, strict=True):
            weight.assign(np.asarray(mean).astype(weight.dtype))
