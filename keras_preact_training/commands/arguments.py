"""What the commands share: the network a command line names, and for those that train
(`train`, `tune`) the config their arguments name; each checked before anything heavy loads."""

import dataclasses
import difflib
import sys

from keras_preact import architectures

from ..data import cifar10_folder

# The flags of `train` and `tune` that set a config field of the same name, after --set.
CONFIG_FLAGS = ("model", "data_dir", "strategy")


def config_from(arguments):
    """The config that `train`'s or `tune`'s arguments name: --config, its --set overrides (text,
    parsed by each field's type), then the values of the flags `CONFIG_FLAGS`, as given. Built
    once a command line (kept on `arguments`), whether its check or its run asks first."""
    from ..train import named_configs

    if getattr(arguments, "built_config", None) is None:
        config = named_configs.get_config(arguments.config, arguments.set)
        flags = {field: getattr(arguments, field) for field in CONFIG_FLAGS if getattr(arguments, field) is not None}
        config = dataclasses.replace(config, **flags)
        arguments.built_config = dataclasses.replace(config, model=model_name(config.model))
    return arguments.built_config


def model_name(name):
    """The registered network (`keras_preact.list_models()`) that `name` names: the name itself, or
    the library's own spelling of it ("ResNet20", "ResNet110OneLayer", "resnet-56"). Keras is not
    imported, so that the error comes in a fraction of a second.

    Raises:
        ValueError: for any other name, suggesting the nearest names.
    """
    names = architectures.model_names()
    spelled = str(name).lower().replace("-", "").replace("onelayer", "_1layer")
    if spelled in names:
        return spelled
    nearest = difflib.get_close_matches(spelled, names, n=3, cutoff=0.6)
    suggestion = f" Did you mean {' or '.join(nearest)}?" if nearest else ""
    raise ValueError(f"Unknown model.{suggestion} Choose one of {', '.join(names)}. Received: model={name!r}")


def check_config_data(arguments):
    """The image folder the config would read, checked before TensorFlow loads: a
    FileNotFoundError in a second, which says how a folder is laid out and made; and a warning
    for a data directory given to the embedded digits, which read none (a warning, not an
    error: the queues pass their data directory to every run they start)."""
    config = config_from(arguments)
    if config.dataset == "folder":
        cifar10_folder.check_folder(config.data_dir)
    if config.dataset == "digits" and config.data_dir is not None:
        print(
            f"warning: data_dir={config.data_dir!r} is not read: the digits are embedded in scikit-learn "
            "(--data-dir is read by the data sets of files: folder, cifar10, cifar100, imagenet2012).",
            file=sys.stderr,
            flush=True,
        )
