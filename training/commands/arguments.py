"""What the commands that train share (`train`, `tune`): the config their arguments name, and
the checks made of it before anything heavy loads."""

import dataclasses
import sys

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
        arguments.built_config = dataclasses.replace(config, **flags)
    return arguments.built_config


def check_model(config):
    """Raises ValueError for a model name that `keras_preact.MODELS` does not hold (imports Keras)."""
    import keras_preact

    if config.model not in keras_preact.MODELS:
        raise ValueError(f"Unknown model. Choose one of {keras_preact.list_models()}. Received: model={config.model!r}")


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
