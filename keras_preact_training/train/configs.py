"""Training configurations as data: one default per experiment of the paper, small overrides.

Every knob of a run is a field of `Config`; `CONFIGS` holds the named defaults and
`Config.override("field=value", ...)` (the command line's `--set`) changes fields.
Schedules are written in the unit the source uses, iterations at the config's
`reference_batch_size` or epochs, and converted to steps at run time
(`Config.to_steps`), so that a different batch size keeps the number of epochs.
"""

import dataclasses
import typing

import keras_preact
from keras_preact import defaults

# The channels of each data set's images: the digits are grey; every other data set (an
# image folder too: its images are decoded to RGB) is RGB.
DATASET_CHANNELS = {"digits": 1}
RGB_CHANNELS = 3
# The largest seed NumPy's and Keras' random generators take (keras.utils.set_random_seed).
MAXIMUM_SEED = 2**32 - 1


def check_seed(seed):
    """Raises a ValueError naming `seed` where NumPy's and Keras' generators would refuse it."""
    if not defaults.is_integer(seed) or not 0 <= seed <= MAXIMUM_SEED:
        raise ValueError(f"seed must be an integer from 0 to 2**32 - 1. Received: seed={seed!r}")


# scikit-learn's 8x8 digits scaled to 0-255 (16 grey levels x 255 / 16): the mean and
# standard deviation of the 1,437 training images (measured, `keras_preact_training.data.datasets`'s split).
DIGITS_MEAN = (77.89,)
DIGITS_STD = (95.71,)
# Fig. 2's ways for shortcut and residual branch to combine: a config's `merge` -> the layer
# every unit merges with (None: addition). keras_preact's layers load on first use, so the
# configs import no Keras (`keras-preact configs` answers without it).
MERGES = {
    "addition": lambda config: None,
    "no_shortcut": lambda config: keras_preact.NoShortcut(),
    "constant_scaling": lambda config: keras_preact.ConstantScaling(*map(float, config.scaling)),
    "exclusive_gating": lambda config: keras_preact.ExclusiveGating(gate_bias=float(config.gate_bias)),
    "shortcut_only_gating": lambda config: keras_preact.ShortcutOnlyGating(gate_bias=float(config.gate_bias)),
    "shortcut_dropout": lambda config: keras_preact.ShortcutDropout(float(config.shortcut_dropout), seed=config.seed),
}
# Keras dtype policies a network trains (and `keras_preact_training.train.evaluate` evaluates) in.
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
# The strategies a run trains under: tf.distribute's (`keras_preact_training.train.tensorflow_steps.make_strategy`),
# and under JAX Keras' data parallelism (`keras_preact_training.train.data_parallel`).
TENSORFLOW_STRATEGIES = ("default", "one_device", "mirrored", "multi_worker", "tpu")
STRATEGIES = (*TENSORFLOW_STRATEGIES, "data_parallel")


# The fields that count something, each at least 1.
POSITIVE_INTEGERS = (
    "batch_size",
    "reference_batch_size",
    "image_size",
    "evaluate_every",
    "checkpoint_every",
    "log_every",
    "cpu_devices",
)
# What `Config.check_numbers` accepts of each number field, as its error says it and as it
# checks it: numbers outside would train a useless network (a negative rate is gradient
# ascent) or fail after training, without an error.
NUMBER_RANGES = {
    "learning_rate": ("> 0", lambda value: value > 0),
    "warmup_learning_rate": (">= 0", lambda value: value >= 0),
    "momentum": ("in [0, 1)", lambda value: 0 <= value < 1),
    "weight_decay": (">= 0", lambda value: value >= 0),
    "decay_factor": ("in (0, 1]", lambda value: 0 < value <= 1),
    "duration": ("> 0", lambda value: value > 0),
    "warmup": (">= 0", lambda value: value >= 0),
    "gate_bias": ("", lambda value: True),
    "shortcut_dropout": ("in [0, 1)", lambda value: 0 <= value < 1),
    "label_smoothing": ("in [0, 1)", lambda value: 0 <= value < 1),
    "average_momentum": ("in [0, 1)", lambda value: 0 <= value < 1),
    "swa_start": ("in [0, 1)", lambda value: 0 <= value < 1),
}
# The averages of the weights a run may keep, by the prefix of their log columns, summary
# fields and registry `weights`: as tables and messages name them, and the setting that keeps
# each (the optimizer's moving average, `average_momentum`; the equal one of the epochs' ends,
# `swa_start`).
AVERAGE_NAMES = {"average": "weights' average", "swa": "weights' equal average (SWA)"}
AVERAGE_SETTINGS = {"average": "average_momentum", "swa": "swa_start"}


@dataclasses.dataclass(frozen=True)
class Config:
    """One training run.

    Attributes:
        model: a name of `keras_preact.list_models()`.
        unit: the residual unit, a key of `keras_preact.units.UNITS` ("original",
            "preactivation", ...); `None` for the model's own (Table 2's placements).
        shortcut: "identity", or "projection" for 1x1 convolution shortcuts (Fig. 2(e)).
        merge: how shortcut and residual combine (Fig. 2): "addition", "no_shortcut",
            "constant_scaling", "exclusive_gating", "shortcut_only_gating" or
            "shortcut_dropout" (`MERGES`).
        gate_bias: b_g, the gates' bias initialisation (Table 1's search).
        scaling: (shortcut scale, residual scale) of "constant_scaling".
        shortcut_dropout: the dropout rate of "shortcut_dropout".
        rematerialize: recompute each unit's branches in the backward pass instead of
            keeping their activations (less memory, same results; see `keras_preact.ResNet`).
        scan_units: run units 2 to the last of each stage as one loop over stacked
            weights (`keras_preact.stacked.StackedUnits`): the same network, built,
            compiled and exported in seconds at any depth. Not with
            `synchronized_batch_norm`. `None`: the model function's choice (loops for
            ResNet-1001 and ResNet-1202; separate units with `synchronized_batch_norm`).
        dataset: "digits" (embedded, offline), "cifar10", "cifar100" (tensorflow-datasets),
            "imagenet2012" (tensorflow-datasets, manual download) or "folder" (an
            image folder `data_dir/{train,test}/<class>/*.jpg`).
        data_dir: tensorflow-datasets' data directory, or the image folder's root (the
            embedded digits read none).
        image_size: side of the square images the network sees.
        train_examples, test_examples: use only N examples of each split, a fixed
            random subset (the first N records of a streamed split); `None` for all.
        validation_examples: hold a fixed random N of the training set out of training
            and evaluate on them instead of the test set, which the run then never
            reads (choices such as the schedule are made on this split); `None`: train
            on the whole training set and evaluate on the test set.
        batch_size: global batch size, over all replicas.
        learning_rate: the rate at `reference_batch_size`; a run at another batch size
            scales it linearly (`scaled_learning_rate`).
        reference_batch_size: the batch size the schedule was written for.
        momentum, nesterov: SGD's.
        weight_decay: the coupled weight decay of the paper (1e-4).
        label_smoothing: the training loss's targets are (1 - this) on the label plus
            this spread evenly over all classes (Szegedy et al., "Rethinking the Inception
            Architecture", 2016, Section 7); 0 for the paper's plain cross-entropy.
            Evaluation losses are always plain cross-entropy.
        average_momentum: keep an exponential moving average of the trainable weights,
            w_avg <- m w_avg + (1 - m) w after each step (Keras optimizers' `use_ema`,
            `ema_momentum`), and evaluate and save the averaged network beside the trained
            one (`average_*` columns of the log, `model_average.keras`), with BatchNorm
            statistics of its own, from 4,096 training images (`loop.average_statistics`);
            0 for none.
        swa_start: keep the equal average of the trainable weights at the end of every
            epoch from this fraction of the run's steps on, the last step's included
            (stochastic weight averaging: Izmailov et al., "Averaging Weights Leads to
            Wider Optima", 2018), and evaluate and save it as `average_momentum`'s average
            is (`swa_*` columns of the log, `model_swa.keras`); 0.75 averages the last
            quarter of the cosine. It costs no training step: the run's steps are those
            of the run without it. 0 for none.
        schedule_unit: "steps" (iterations at `reference_batch_size`) or "epochs", for
            `duration`, `decay_boundaries` and `warmup`.
        schedule: "step", the paper's: the rate multiplied by `decay_factor` at each of
            `decay_boundaries`; or "cosine": from the rate down to 0 at the end along
            half a cosine (Loshchilov and Hutter, SGDR, 2017), `decay_boundaries` unused.
        duration: the length of training.
        decay_boundaries: where the step schedule multiplies the rate by `decay_factor`.
        decay_factor: the step schedule's factor at each boundary (the paper: 0.1).
        warmup, warmup_learning_rate: a first phase at a fixed small rate; the
            warm-up rate is scaled with the batch size like `learning_rate`.
        crop_padding: pixels of zero padding before the random crop (0: no crop).
        horizontal_flip: random horizontal flips.
        cutout: the side of the square of zeros Cutout puts at a random place in every
            training image after normalisation (DeVries and Taylor, 2017; 16 on CIFAR-10);
            0 for none.
        normalization_mean, normalization_std: per-channel (or one value for every channel),
            on the 0-255 scale.
        evaluate_every: steps between two evaluations on the test set (and the end).
        checkpoint_every: steps between two checkpoints (and the end).
        log_every: steps between two rows of the CSV log and TensorBoard.
        seed: seed of the weights, the data order and the augmentation (0 to 2**32 - 1).
        strategy: under TensorFlow, the tf.distribute strategy: "default", "one_device",
            "mirrored", "multi_worker" or "tpu"; under JAX, "default" (one device) or
            "data_parallel" (Keras' `keras.distribution.DataParallel` over every device of
            every process, `keras_preact_training.train.data_parallel`).
        cpu_devices: split the CPU into this many logical devices (for "mirrored").
        synchronized_batch_norm: BatchNorm statistics over all replicas; the paper
            computes them per GPU (64 images of a batch of 128), the default.
        precision: "float32", "mixed_bfloat16" or "mixed_float16"; or "auto": mixed_bfloat16
            where the device that trains computes bfloat16 natively, float32 elsewhere
            (`keras_preact_training.train.precision`; a run records what it resolved to).
        xla: compile the training step with XLA.
        fused_batch_norm: BatchNorm through TensorFlow's fused kernel where it applies
            (`keras_preact.base_layers.BatchNorm`); false for the portable `keras.ops` path.
            The same results to float rounding, and checkpoints of either load in the other.
        deterministic: bitwise reproducible runs: deterministic kernels, one thread per
            kernel, no Grappler rewrites. Slower; a resumed or multi-worker run then
            ends with exactly the weights of an uninterrupted one-process run.
        input_pipeline: what reads and decodes the images: "tensorflow" (tf.data, which
            `tf.distribute` needs) or "numpy" (NumPy and Pillow, for JAX and PyTorch
            without TensorFlow; image folders and the digits). Both give the same batches.
            `None`: "tensorflow" where TensorFlow is installed, else "numpy".
    """

    model: str = "resnet110"
    unit: str | None = None
    shortcut: str = "identity"
    merge: str = "addition"
    gate_bias: float = 0.0
    scaling: tuple = (0.5, 1.0)
    shortcut_dropout: float = 0.5
    rematerialize: bool = False
    scan_units: bool | None = None
    dataset: str = "cifar10"
    data_dir: str | None = None
    image_size: int = 32
    train_examples: int | None = None
    test_examples: int | None = None
    validation_examples: int | None = None
    batch_size: int = 128
    learning_rate: float = 0.1
    reference_batch_size: int = 128
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = defaults.WEIGHT_DECAY
    label_smoothing: float = 0.0
    average_momentum: float = 0.0
    swa_start: float = 0.0
    schedule_unit: str = "steps"
    schedule: str = "step"
    duration: float = 64000
    decay_boundaries: tuple = (32000, 48000)
    decay_factor: float = 0.1
    warmup: float = 400
    warmup_learning_rate: float = 0.01
    crop_padding: int = 4
    horizontal_flip: bool = True
    cutout: int = 0
    normalization_mean: tuple = defaults.CIFAR10_MEAN
    normalization_std: tuple = defaults.CIFAR10_STD
    evaluate_every: int = 4000
    checkpoint_every: int = 1000
    log_every: int = 100
    seed: int = 0
    strategy: str = "default"
    cpu_devices: int = 1
    synchronized_batch_norm: bool = False
    precision: str = "float32"
    xla: bool = False
    fused_batch_norm: bool = True
    deterministic: bool = False
    input_pipeline: str | None = None

    def __post_init__(self):
        self.check_choices()
        self.check_numbers()
        self.check_combinations()
        self.check_normalization()
        check_seed(self.seed)

    def check_choices(self):
        """Raises ValueError for a field outside its choices (datasets, schedules, units, ...)."""
        choices = {
            "dataset": ("digits", "cifar10", "cifar100", "imagenet2012", "folder"),
            "schedule_unit": ("steps", "epochs"),
            "schedule": ("step", "cosine"),
            "strategy": STRATEGIES,
            "precision": (*PRECISIONS, "auto"),
            "shortcut": ("identity", "projection"),
            "merge": MERGES,
        }
        if self.input_pipeline is not None:
            choices["input_pipeline"] = ("tensorflow", "numpy")
        for field, allowed in choices.items():
            if getattr(self, field) not in allowed:
                raise ValueError(f"{field} must be one of {list(allowed)}. Received: {field}={getattr(self, field)!r}")
        if self.unit is not None:
            from keras_preact import units  # here: configs import without Keras (`keras-preact configs`)

            if self.unit not in units.UNITS:
                raise ValueError(
                    f"unit must be None (the model's) or one of {sorted(units.UNITS)}. Received: unit={self.unit!r}"
                )

    def check_numbers(self):
        """Raises ValueError for a count, rate or size outside what trains a useful network."""
        for field in POSITIVE_INTEGERS:
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{field} must be a positive integer. Received: {field}={value!r}")
        for field, (text, accepted) in NUMBER_RANGES.items():
            value = getattr(self, field)
            if not defaults.is_finite_number(value) or not accepted(value):
                raise ValueError(
                    f"{field} must be a finite number{' ' * bool(text)}{text}. Received: {field}={value!r}"
                )
        if not defaults.is_integer(self.cutout) or self.cutout < 0:
            raise ValueError(f"cutout must be an integer >= 0 (0: none). Received: cutout={self.cutout!r}")
        for field in ("train_examples", "test_examples", "validation_examples"):
            value = getattr(self, field)
            if value is not None and (not defaults.is_integer(value) or value < 1):
                raise ValueError(f"{field} must be None (all) or a positive integer. Received: {field}={value!r}")
        for field in ("normalization_std", "decay_boundaries", "scaling", "normalization_mean"):
            values = getattr(self, field)
            if not all(defaults.is_finite_number(value) for value in values) or (
                field == "normalization_std" and not all(value > 0 for value in values)
            ):
                raise ValueError(
                    f"{field} must hold finite numbers{' > 0' if field == 'normalization_std' else ''}. "
                    f"Received: {field}={values!r}"
                )
        if len(self.scaling) != 2:
            raise ValueError(f"scaling must be (shortcut scale, residual scale). Received: scaling={self.scaling!r}")

    def check_combinations(self):
        """Raises ValueError for settings that cannot run together."""
        if self.xla and self.synchronized_batch_norm:
            raise ValueError(
                "xla and synchronized_batch_norm cannot be combined: XLA cannot compile BatchNorm's "
                "cross-replica reduction. Received: xla=True, synchronized_batch_norm=True"
            )
        if self.scan_units and self.synchronized_batch_norm:
            raise ValueError(
                "scan_units and synchronized_batch_norm cannot be combined: tf.distribute cannot reduce "
                "BatchNorm's statistics across replicas inside a loop. Received: scan_units=True, "
                "synchronized_batch_norm=True"
            )

    def check_normalization(self):
        """Raises ValueError for a mean and std that do not fit the data set's channels."""
        channels = DATASET_CHANNELS.get(self.dataset, RGB_CHANNELS)
        for field in ("normalization_mean", "normalization_std"):
            if len(getattr(self, field)) not in (1, channels):
                raise ValueError(
                    f"{field} needs one value (for every channel) or one per channel of the {self.dataset} "
                    f"images ({channels}). Received: {field}={getattr(self, field)!r}"
                )
        if len(self.normalization_mean) != len(self.normalization_std):
            raise ValueError(
                "normalization_mean and normalization_std need as many values each. Received: "
                f"normalization_mean={self.normalization_mean!r}, normalization_std={self.normalization_std!r}"
            )

    @property
    def scaled_learning_rate(self):
        """The learning rate at `batch_size`: linear scaling from `reference_batch_size`."""
        return self.learning_rate * self.batch_size / self.reference_batch_size

    @property
    def scaled_warmup_learning_rate(self):
        return self.warmup_learning_rate * self.batch_size / self.reference_batch_size

    def to_steps(self, amount, steps_per_epoch):
        """`amount` of `schedule_unit` in steps of `batch_size` examples."""
        if self.schedule_unit == "epochs":
            return round(amount * steps_per_epoch)
        return round(amount * self.reference_batch_size / self.batch_size)

    def total_steps(self, steps_per_epoch):
        return self.to_steps(self.duration, steps_per_epoch)

    def override(self, *assignments):
        """A copy with `field=value` assignments applied; values are parsed by the field's type."""
        changes = {}
        fields = {field.name: field for field in dataclasses.fields(self)}
        for assignment in assignments:
            name, separator, text = assignment.partition("=")
            if not separator or name not in fields:
                raise ValueError(
                    f"Each override must be field=value with a field of {sorted(fields)}. Received: {assignment!r}"
                )
            changes[name] = parse_value(text, fields[name].type, name)
        return dataclasses.replace(self, **changes)


def parse_value(text, kind, name):
    """Parses `text` as the field's declared type `kind` (bool, int, float, tuple or str, or one
    of them or None); "none" is None for any field but a bool, and for a bool that may be None."""
    optional = type(None) in typing.get_args(kind)
    kind = next((argument for argument in typing.get_args(kind) if argument is not type(None)), kind)
    if text.lower() == "none" and (kind is not bool or optional):
        return None
    try:
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return text.lower() in ("true", "1", "yes")
        if kind is tuple:
            return tuple(float(part) if "." in part else int(part) for part in text.split(",") if part)
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
    except ValueError:
        raise ValueError(f"{name} takes a {kind.__name__}. Received: {name}={text!r}") from None
    return text


def field_defaults():
    """{field: default} of every `Config` field that has one: what a run whose config.json
    predates a field trained with."""
    return {
        field.name: field.default for field in dataclasses.fields(Config) if field.default is not dataclasses.MISSING
    }


def steps_per_epoch(examples, batch_size):
    """Full global batches per epoch (the last partial batch is dropped)."""
    steps = examples // batch_size
    if steps < 1:
        raise ValueError(
            f"batch_size must not exceed the number of training examples ({examples}). Received: batch_size={batch_size}"
        )
    return steps
