"""`keras-preact`: train keras-preact networks with the paper's recipe.

    keras-preact train --config digits_demo                 # the main job, offline
    keras-preact train --config cifar10_paper --set model=resnet164 --seeds 5
    keras-preact train --config cifar10_paper --data-dir ~/tensorflow_datasets \\
        --strategy mirrored --set batch_size=256
    KERAS_BACKEND=jax keras-preact train --config cifar10_zoo --data-dir DIR   # on JAX
    KERAS_BACKEND=torch keras-preact train --config cifar10_zoo --data-dir DIR # on PyTorch; no TensorFlow needed
    keras-preact configs                                    # the configs and their fields
    keras-preact data cifar-10-python.tar.gz                # the CIFAR-10 image folder, from the official file
    keras-preact evaluate --model resnet20 --weights cifar10  # test error, per class, on that folder
    keras-preact zoo                                        # the shipped networks and their errors
    keras-preact zoo --units                                # original against pre-activation units
    keras-preact compare RUN_DIR RUN_DIR                    # error against hours, side by side
    keras-preact export --run-dir runs/demo                 # a SavedModel for TF Serving
    keras-preact export --model resnet20 --weights cifar10 --images docs/cifar10/*.jpg   # shipped weights
    keras-preact serve saved_models/cifar10_resnet20        # TF Serving's REST API, locally
    keras-preact query --model cifar10_resnet20 docs/cifar10/cat_0000.jpg    # top-k classes from a server
    keras-preact tune --config cifar10_paper --data-dir ~/tensorflow_datasets   # Table 1's b_g search
    keras-preact tune ... --chief HOST:PORT | --worker HOST:PORT --worker-id NAME  # across processes
    keras-preact ablate --table 2 --models resnet20 --set duration=2000      # Table 2, small budget

Each command is one module of this package (its name the command's), holding what the
command line accepts of it and what it does:

- `HELP` and `DESCRIPTION`: its line in `keras-preact --help` and its own `--help`;
- `add_arguments(parser)`: its arguments;
- `TENSORFLOW`: "never" (it answers without importing TensorFlow), "optional" (imported
  where installed; the command runs without it under JAX and PyTorch) or "always";
- `BACKENDS`: Keras' backends it computes on (None: it computes nothing with Keras);
- `check(arguments)`, where present: what is checked before TensorFlow loads (a second,
  against the 4-29 s of loading it);
- `run(arguments)`: the command, returning its exit code.

A new command is one module and its name in `COMMANDS`. The docstring above is
`keras-preact --help`'s description (its first paragraph) and examples (the rest).
"""

import argparse
import importlib

# Every command, in `keras-preact --help`'s order.
COMMANDS = (
    "train",
    "configs",
    "diagnose",
    "evaluate",
    "data",
    "publish",
    "zoo",
    "compare",
    "export",
    "serve",
    "query",
    "tune",
    "ablate",
)


def command(name):
    """The module of command `name`, imported by name: only the command that runs is imported, so
    that the commands without TensorFlow (data, query, zoo, serve's onnxruntime) never load it."""
    return importlib.import_module(f"{__name__}.{name}")


def parser():
    """`keras-preact`'s argument parser: every command's, with the options they share."""
    main = argparse.ArgumentParser(
        prog="keras-preact",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--verbose",
        action="store_true",
        help="show TensorFlow's C++ and absl log lines (hidden by default)",
    )
    subcommands = main.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        module = command(name)
        options = dict(help=module.HELP)
        if getattr(module, "DESCRIPTION", None):
            options["description"] = module.DESCRIPTION
        module.add_arguments(subcommands.add_parser(name, parents=[common], **options))
    return main
