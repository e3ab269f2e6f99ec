"""The named configs: one `Config` per experiment of the paper and the zoo's recipe, each with
its purpose, the paper's result and the command that runs it (`keras-preact configs`), and
`get_config`, which `--config NAME --set field=value` reads."""

import dataclasses

from keras_preact import defaults

from .configs import DIGITS_MEAN, DIGITS_STD, Config

# The paper's CIFAR-10 recipe for CIFAR-10 image folders on a CPU: 30 epochs, the rate /10
# at half and three quarters of them as the paper's 32k and 48k of 64k iterations.
CIFAR10_CPU = Config(
    model="resnet20",
    dataset="folder",
    schedule_unit="epochs",
    duration=30,
    decay_boundaries=(15, 22.5),
    warmup=1,
    evaluate_every=390,
    checkpoint_every=390,
    log_every=39,
)
# The zoo's recipe, chosen on a validation split for the lowest error per CPU-hour
# (docs/zoo.md): cifar10_cpu with the search's choices, twice as long.
CIFAR10_ZOO = dataclasses.replace(
    CIFAR10_CPU,
    schedule="cosine",
    nesterov=True,
    weight_decay=5e-4,
    precision="auto",
    duration=60,
    learning_rate=0.2,
    cutout=16,
)


@dataclasses.dataclass(frozen=True)
class NamedConfig:
    """A named config with what `keras-preact configs` says of it.

    Attributes:
        config: the `Config`.
        purpose: what it is for.
        paper: the paper's result for it.
        command: the command that runs it.
    """

    config: Config
    purpose: str
    paper: str
    command: str


# Every named config, with its purpose, the paper's result and its command.
NAMED_CONFIGS = {
    "cifar10_paper": NamedConfig(
        Config(),
        purpose="The paper's CIFAR-10 recipe (appendix): SGD momentum 0.9, lr 0.1 (0.01 for the first 400 "
        "iterations), /10 at 32k and 48k iterations, 64k in all, batch 128, weight decay 1e-4, 4-pixel "
        "crops and flips.",
        paper="Table 3: ResNet-110 6.37 %, ResNet-164 5.46 % test error.",
        command="keras-preact train --config cifar10_paper --set model=resnet164",
    ),
    "cifar100_paper": NamedConfig(
        Config(dataset="cifar100", normalization_mean=defaults.CIFAR100_MEAN, normalization_std=defaults.CIFAR100_STD),
        purpose="The same recipe on CIFAR-100, normalised with CIFAR-100's per-channel mean and std (fb.resnet.torch).",
        paper="Table 3: ResNet-164 24.33 %, ResNet-1001 22.71 % test error.",
        command="keras-preact train --config cifar100_paper --set model=resnet164",
    ),
    # Units 2-111 of each stage run as one loop: the same network, built in about a
    # second and at its first step in seconds instead of minutes (docs/benchmarks.md).
    "cifar10_resnet1001_torch": NamedConfig(
        Config(
            model="resnet1001",
            scan_units=True,
            batch_size=64,
            reference_batch_size=64,
            nesterov=True,
            schedule_unit="epochs",
            duration=200,
            decay_boundaries=(81, 122),
            warmup=0,
            evaluate_every=7812,
            checkpoint_every=781,
        ),
        purpose="The official Torch code's ResNet-1001 run (resnet-1k-layers): batch 64, Nesterov, 200 epochs, "
        "/10 at epochs 81 and 122, lr 0.1 at batch 64, no warm-up; units 2-111 of each stage as one loop.",
        paper="Table 4: 4.62 % (4.69 +- 0.20) test error on CIFAR-10.",
        command="keras-preact train --config cifar10_resnet1001_torch",
    ),
    "imagenet_paper": NamedConfig(
        Config(
            model="resnet200",
            dataset="imagenet2012",
            image_size=224,
            batch_size=256,
            reference_batch_size=256,
            schedule_unit="epochs",
            duration=90,
            decay_boundaries=(30, 60),
            warmup=0,
            crop_padding=0,
            normalization_mean=defaults.IMAGENET_MEAN,
            normalization_std=defaults.IMAGENET_STD,
            evaluate_every=5000,
            log_every=100,
        ),
        purpose="ImageNet (Section 5, and fb.resnet.torch): lr 0.1, /10 at epochs 30 and 60, batch 256, 90 epochs; "
        "scale augmentation, 224x224 crops, flips.",
        paper="Table 5 (320x320 test crop): pre-activation ResNet-200 20.7 % / 5.3 % top-1 / top-5 error; "
        "20.1 % / 4.8 % with scale and aspect-ratio augmentation.",
        command="keras-preact train --config imagenet_paper --set data_dir=/data/tfds",
    ),
    "cifar10_cpu": NamedConfig(
        CIFAR10_CPU,
        purpose="The paper's CIFAR-10 recipe shortened for a CPU, on CIFAR-10 image folders: lr 0.1 after a first "
        "epoch at 0.01, 30 epochs (the paper: 164), /10 at half and three quarters of them as the paper's 32k and "
        "48k of 64k iterations; the base of the zoo's recipe, cifar10_zoo (docs/zoo.md).",
        paper="He et al. 2015, Table 6 (164 epochs): ResNet-20 8.75 %, ResNet-56 6.97 % test error.",
        command="keras-preact train --config cifar10_cpu --model resnet20 --data-dir ~/.cache/keras-preact/cifar10-png",
    ),
    "cifar10_zoo": NamedConfig(
        CIFAR10_ZOO,
        purpose="The zoo's recipe (keras_preact/weights), chosen on 5,000 training images held out (docs/zoo.md): "
        "cifar10_cpu at twice its peak learning rate (0.2) with Cutout (one 16 x 16 square an image; DeVries "
        "and Taylor, 2017), Nesterov momentum (as the official Torch code's SGD, fb.resnet.torch), weight "
        "decay 5e-4 (Zagoruyko and Komodakis, Wide Residual Networks, 2016), the cosine schedule (Loshchilov "
        "and Hutter, SGDR, 2017) after a first epoch at 0.01, and bfloat16 mixed precision where the processor "
        "computes it natively, float32 elsewhere (precision=auto; no accuracy lost, docs/benchmarks.md).",
        paper="He et al. 2015, Table 6 (164 epochs): ResNet-20 8.75 %, ResNet-56 6.97 %, ResNet-110 6.43 % test "
        "error; this paper, Table 3: pre-activation ResNet-110 6.37 %.",
        command="keras-preact train --config cifar10_zoo --model resnet56 --data-dir ~/.cache/keras-preact/cifar10-png",
    ),
    "cifar100_zoo": NamedConfig(
        dataclasses.replace(
            CIFAR10_ZOO, cutout=8, normalization_mean=defaults.CIFAR100_MEAN, normalization_std=defaults.CIFAR100_STD
        ),
        purpose="The zoo's recipe on CIFAR-100 image folders: cifar10_zoo with CIFAR-100's per-channel mean and std "
        "(fb.resnet.torch) and Cutout of 8 x 8, the size DeVries and Taylor (2017) chose for CIFAR-100.",
        paper="This paper, Table 4: pre-activation ResNet-164 24.33 %, original 25.16 % test error (CIFAR-100); "
        "public zoos: ResNet-20 31.5 %, ResNet-56 27.6 % (chenyaofo/pytorch-cifar-models, 200 epochs).",
        command="keras-preact train --config cifar100_zoo --model resnet56 --data-dir ~/.cache/keras-preact/cifar100-png",
    ),
    "digits_demo": NamedConfig(
        Config(
            model="resnet20",
            dataset="digits",
            image_size=8,
            batch_size=64,
            reference_batch_size=128,
            schedule_unit="epochs",
            duration=40,
            decay_boundaries=(20, 30),
            warmup=1,
            crop_padding=1,
            horizontal_flip=False,
            normalization_mean=DIGITS_MEAN,
            normalization_std=DIGITS_STD,
            evaluate_every=100,
            checkpoint_every=100,
            log_every=10,
        ),
        purpose="The main job: a pre-activation ResNet-20 on scikit-learn's 8x8 handwritten digits, offline, about "
        "a minute on 2 CPU cores. One-pixel crops, no flips (a flipped digit is another symbol); the CIFAR "
        "schedule squeezed into 40 epochs.",
        paper="None: the digits are not in the paper.",
        command="keras-preact train --config digits_demo",
    ),
}
# The named configs alone, as `get_config` and `--config` read them.
CONFIGS = {name: named.config for name, named in NAMED_CONFIGS.items()}


def field_descriptions():
    """{field: its description}, from the Attributes of `Config`'s docstring (fields described
    together, as "momentum, nesterov: SGD's.", share theirs)."""
    attributes = Config.__doc__.split("Attributes:", 1)[1]
    descriptions, names = {}, []
    for line in attributes.splitlines():
        text = line.strip()
        head, separator, rest = text.partition(": ")
        if separator and line.startswith(" " * 8) and not line.startswith(" " * 12):
            names = [name.strip() for name in head.split(",")]
            text = rest
        for name in names:
            descriptions[name] = f"{descriptions.get(name, '')} {text}".strip()
    return descriptions


def describe(name, every_field=False):
    """A config as printed lines: its purpose, the paper's result, its command, then one field per
    line: those that differ from `Config`'s defaults, or `every_field` with its description."""
    named = NAMED_CONFIGS[name]
    config = named.config
    lines = [f"{name}: {named.purpose}", f"  paper: {named.paper}", f"  command: {named.command}"]
    base, descriptions = Config(), field_descriptions()
    for field in dataclasses.fields(Config):
        value = getattr(config, field.name)
        if every_field:
            lines.append(f"  {field.name} = {value!r}  # {descriptions[field.name]}")
        elif value != getattr(base, field.name):
            lines.append(f"  {field.name} = {value!r}")
    return lines


def get_config(name, overrides=()):
    """The named config with `field=value` overrides applied.

    Raises:
        ValueError: for an unknown name or a bad override.
    """
    if name not in CONFIGS:
        raise ValueError(f"Unknown config. Choose one of {sorted(CONFIGS)}. Received: config={name!r}")
    return CONFIGS[name].override(*overrides)
