"""The paper's experiments and the zoo: Table 1's gate-bias search (keras-tuner), the tables'
ablations, the signal-propagation diagnosis, the comparison of runs by time to accuracy, and
the model zoo's publishing and tables.

Imports `train`, `data`, `export` and the package's base modules; `commands` and `cli`
import it."""

# tune: the gatings of Table 1 searched, the keras-tuner tuners offered, and the training
# images held out for the search's objective.
GATINGS = ("exclusive_gating", "shortcut_only_gating")
# b_g from 0 to -10 in steps of -1 (paper, Section 3.1).
GATE_BIASES = tuple(range(0, -11, -1))
TUNER_NAMES = ("grid", "random", "hyperband")
DEFAULT_VALIDATION_EXAMPLES = 5000
