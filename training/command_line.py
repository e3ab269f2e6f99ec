"""`keras-preact`: train keras-preact networks with the paper's recipe.

    keras-preact train --config digits_demo                 # the main job, offline
    keras-preact train --config cifar10_paper --set model=resnet164 --seeds 5
    keras-preact train --config cifar10_paper --data-dir ~/tensorflow_datasets \\
        --strategy mirrored --set batch_size=256
    KERAS_BACKEND=jax keras-preact train --config cifar10_zoo --data-dir DIR   # on JAX, one device
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
"""

import argparse
import dataclasses
import os

from .data import cifar10_folder

# What keras-preact's command line accepts, and the config that `train`'s or `tune`'s parsed
# arguments name; `cli` runs the commands. The docstring above is `keras-preact --help`'s
# description (its first paragraph) and examples (the rest).


def parser():
    from . import defaults
    from .export import contract
    from .train import configs

    main = argparse.ArgumentParser(
        prog="keras-preact",
        description=__doc__.split("\n\n")[0],
        epilog="\n".join(__doc__.split("\n")[2:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--verbose",
        action="store_true",
        help="show TensorFlow's C++ and absl log lines (hidden by default); serve: log every request",
    )
    commands = main.add_subparsers(dest="command", required=True)

    def command(name, **options):
        return commands.add_parser(name, parents=[common], **options)

    train = command(
        "train",
        help="train a network (resumes from the run directory's last checkpoint)",
        description="Train a network with a config of the paper's recipe. Running the same command again "
        "resumes from the last checkpoint of its run directory.",
    )
    train.add_argument(
        "--config", default="digits_demo", help=f"one of {sorted(configs.CONFIGS)} (default: digits_demo)"
    )
    train.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a config field, e.g. --set model=resnet164 --set batch_size=64 "
        "(repeatable; `keras-preact configs` lists the fields)",
    )
    train.add_argument("--model", help="shortcut for --set model=NAME")
    train.add_argument("--data-dir", help="tensorflow-datasets data directory, or the root of an image folder")
    train.add_argument(
        "--strategy",
        choices=configs.STRATEGIES,
        help="under TensorFlow, the tf.distribute strategy (multi_worker reads the cluster from TF_CONFIG); "
        "under KERAS_BACKEND=jax, default (one device) or data_parallel (every device of every process)",
    )
    train.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="data_parallel over several processes: process 0's host and a free port (or "
        "KERAS_DISTRIBUTION_JOB_ADDRESSES), with --processes and --process-id",
    )
    train.add_argument("--processes", type=int, help="the number of processes (or KERAS_DISTRIBUTION_NUM_PROCESSES)")
    train.add_argument(
        "--process-id", type=int, help="this process's id, 0 to --processes - 1 (or KERAS_DISTRIBUTION_PROCESS_ID)"
    )
    train.add_argument(
        "--run-dir", help="where checkpoints, logs, plots and the model go (default: runs/<config>-<model>)"
    )
    train.add_argument(
        "--allow-config-changes",
        action="store_true",
        help="resume a run with settings other than those it started with (refused otherwise; "
        "data_dir, evaluate_every, checkpoint_every, log_every and fused_batch_norm may always "
        "change)",
    )
    train.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="train this many seeds (0, 1, ...) and report "
        "the median and mean +- std of the final test error, as the paper does",
    )
    configs_parser = command(
        "configs",
        help="list the configs (purpose, paper result, command, fields changed), or one in full",
        description="List every config: what it is for, the paper's result, the command that runs it, and the "
        "fields it changes from the defaults, one per line; with a NAME, that config's every field and what it "
        "means.",
    )
    configs_parser.add_argument(
        "name",
        nargs="?",
        choices=sorted(configs.CONFIGS),
        metavar="NAME",
        help=f"one of {sorted(configs.CONFIGS)}: print every field of it",
    )
    diagnose = command(
        "diagnose",
        help="measure and plot how signals and gradients propagate through the units",
        description="Measure, at initialisation and on a batch of real images, the norms of every unit's "
        "output, residual and shortcut and of the gradient at its input, for the paper's comparisons "
        "(original vs pre-activation, plain vs residual, scaled and gated shortcuts); write plots and tables.",
    )
    diagnose.add_argument(
        "--depths",
        type=int,
        nargs="+",
        default=[110, 164, 1001],
        help="CIFAR depths for original vs pre-activation (default: 110 164 1001)",
    )
    diagnose.add_argument(
        "--depth",
        type=int,
        default=110,
        help="depth of the plain, scaled and gated comparisons (default: 110, basic units)",
    )
    diagnose.add_argument("--batch-size", type=int, default=16, help="images in the batch (default: 16)")
    diagnose.add_argument("--data-dir", help="CIFAR-10 as an image folder; default: the embedded digits")
    diagnose.add_argument("--seed", type=int, default=0, help="seed of the networks' initialisation (default: 0)")
    diagnose.add_argument("--output", default=os.path.join("runs", "diagnose"), help="default: runs/diagnose")
    evaluate_parser = command(
        "evaluate",
        help="test (or training-set) error and per-class accuracy of shipped weights or a weights file",
        description="Evaluate a network with keras-preact's shipped weights (--weights cifar10, checked against "
        "their SHA-256) or a .weights.h5 file saved from the same network on the test split (or, with --split "
        "train, the training split) of a CIFAR-10-like data set: 0-255 pixels normalised with CIFAR-10's "
        "statistics inside the model, one original image each.",
    )
    evaluate_parser.add_argument("--model", required=True, help="the network, a name of keras_preact.list_models()")
    evaluate_parser.add_argument(
        "--weights", default="cifar10", help="'cifar10' for the shipped weights (default), or a .weights.h5 file"
    )
    evaluate_parser.add_argument(
        "--dataset",
        default="folder",
        choices=["folder", "cifar10"],
        help="an image folder data_dir/{train,test}/<class>/ (default), or tensorflow-datasets' cifar10",
    )
    evaluate_parser.add_argument(
        "--data-dir",
        help="the image folder (default: keras-preact data's, "
        f"{cifar10_folder.CIFAR10_FOLDER}), or tensorflow-datasets' data directory",
    )
    evaluate_parser.add_argument(
        "--batch-size",
        type=int,
        default=defaults.EVALUATION_BATCH_SIZE,
        help=f"images per inference batch (default: {defaults.EVALUATION_BATCH_SIZE})",
    )
    evaluate_parser.add_argument(
        "--flip",
        action="store_true",
        help="also report the error of the test-time flip: each image's class from the mean "
        "of its and its mirror image's probabilities",
    )
    evaluate_parser.add_argument(
        "--split",
        default="test",
        choices=list(defaults.EVALUATION_SPLITS),
        help="the split measured: test (default), or train for how well the network fits "
        "its training images (inference mode, no augmentation)",
    )
    data_parser = command(
        "data",
        help="make the CIFAR-10 image folder that evaluate and the docs' commands read, from an archive",
        description="Make the image folder (train/<class>/<image> and test/<class>/<image>) that `keras-preact "
        f"evaluate` reads by default ({cifar10_folder.CIFAR10_FOLDER}), or --data-dir, from CIFAR-10's release for "
        "Python (cifar-10-python.tar.gz, as keras.datasets downloads it: its images become PNG files, the zoo's "
        "data) or from an archive of an image folder; once: a folder already made is left as it is, and a folder "
        "that it did not make is never touched.",
    )
    data_parser.add_argument(
        "archive", help="cifar-10-python.tar.gz, or a .tar, .tar.gz, .tar.xz or .zip of an image folder"
    )
    data_parser.add_argument(
        "--data-dir",
        default=cifar10_folder.CIFAR10_FOLDER,
        help=f"where the folder goes (default: {cifar10_folder.CIFAR10_FOLDER})",
    )
    publish = command(
        "publish",
        help="put a finished CIFAR-10 run's network into the model zoo (keras_preact/weights)",
        description="Save the network of a finished CIFAR-10 run as keras_preact/weights/cifar10_<name>.weights.h5 "
        "and register it (SHA-256, test error of the saved file, the run's config, command and hours), so that "
        "keras_preact.get_model(name, weights='cifar10') loads it.",
    )
    publish.add_argument("--run-dir", required=True, help="a finished run of `keras-preact train`")
    publish.add_argument("--name", required=True, help="the network's name, e.g. resnet20 or resnet20_original")
    publish.add_argument("--data-dir", help="the run's data, to evaluate the saved file (default: the run's)")
    publish.add_argument(
        "--images-per-second",
        type=float,
        help="the network's training rate measured alone on the machine that trained it "
        "(python bench/training_throughput.py): the entry records the hours alone",
    )
    zoo_command = command(
        "zoo",
        help="print the model zoo's table: the shipped networks, their test error beside the published",
        description="Print, as Markdown, every network with shipped CIFAR-10 weights: unit, parameters, final "
        "test error on the 10,000 test images beside the paper's and two reimplementations', training hours, "
        "recipe, file size and SHA-256 (from keras_preact/weights/registry.json).",
    )
    zoo_command.add_argument(
        "--units",
        action="store_true",
        help="print instead the original against the pre-activation unit at each depth "
        "shipped with both under one recipe (Table 3 at the zoo's scale)",
    )
    compare = command(
        "compare",
        help="finished runs side by side: final error, hours, a time-to-accuracy plot",
        description="Compare finished runs (e.g. one network under different schedules, evaluated on a "
        "validation split): write time_to_accuracy.png (error against training hours) and comparison.md "
        "(final error, hours, hours to come within a point of the best) to --output.",
    )
    compare.add_argument("run_dirs", nargs="+", help="finished runs of `keras-preact train`")
    compare.add_argument("--output", default=os.path.join("runs", "compare"), help="default: runs/compare")
    compare.add_argument(
        "--images-per-second",
        type=float,
        help="the runs' measured training rate on this machine, for their hours (default: "
        "each run's logged hours, which count stretches that shared the CPU)",
    )
    compare.add_argument(
        "--target", type=float, help="an error in percent: the table adds the hours each run needs to reach it"
    )
    export_parser = command(
        "export",
        help="export a trained run or shipped weights as a SavedModel for TF Serving, then check it",
        description="Export the model of a finished training run (--run-dir), or a network with keras-preact's "
        "shipped weights (--model, --weights cifar10), to <output>/<name>/<version>/ with the signatures "
        "serving_default (encoded images), predict_pixels (uint8) and predict_normalized (float), and "
        "metadata.json; reload it and print its classes for --images, or else for the first test image of the "
        "run's data.",
    )
    export_parser.add_argument("--run-dir", help="a finished run of `keras-preact train`")
    export_parser.add_argument("--model", help="a network with shipped weights, e.g. resnet20 (with --weights)")
    export_parser.add_argument("--weights", choices=["cifar10"], help="the shipped weights of --model")
    export_parser.add_argument(
        "--images",
        nargs="+",
        metavar="IMAGE",
        help="image files (JPEG, PNG, GIF, BMP) to classify with the reloaded SavedModel",
    )
    export_parser.add_argument(
        "--output",
        default=defaults.DEFAULT_DIRECTORY,
        help=f"folder of exported models (default: {defaults.DEFAULT_DIRECTORY})",
    )
    export_parser.add_argument("--name", help="model name, the folder TF Serving serves (default: <dataset>_<model>)")
    export_parser.add_argument("--version", type=int, help="version number (default: one more than the highest there)")
    export_parser.add_argument(
        "--top-k",
        type=int,
        default=defaults.DEFAULT_TOP_K,
        help=f"classes each prediction lists (default: {defaults.DEFAULT_TOP_K})",
    )
    export_parser.add_argument(
        "--format",
        choices=defaults.EXPORT_FORMATS,
        default=defaults.EXPORT_FORMATS[0],
        help="saved_model (default), onnx (the pixel signatures as ONNX models in <version>/"
        "onnx/, checked with onnxruntime; needs keras-preact[onnx]), litert (predict_pixels as "
        "LiteRT models in <version>/litert/, checked with LiteRT's interpreter; needs "
        "keras-preact[litert]) or all (the three)",
    )
    export_parser.add_argument(
        "--quantize",
        nargs="+",
        choices=contract.QUANTIZED,
        default=[],
        metavar="PRECISION",
        help="also write these precisions beside float32, in the formats that offer them: float16 "
        "(LiteRT) and int8 (ONNX and LiteRT; needs --calibration-images)",
    )
    export_parser.add_argument(
        "--calibration-images",
        nargs="+",
        metavar="IMAGE",
        help="images that calibrate int8: a few hundred training images of the network's size "
        "(files, or folders read recursively)",
    )
    export_parser.add_argument(
        "--no-fold",
        dest="fold",
        action="store_false",
        help="export the network as it trains, with BatchNorm after each convolution "
        "(default: BatchNorm folded into the convolution before it, the same outputs)",
    )
    serve_parser = command(
        "serve",
        help="serve an exported model over TF Serving's REST API",
        description="Serve the highest version of a model folder at /v1/models/<name> with TF Serving's REST "
        'API (GET status and metadata, POST :predict with instances or inputs, images as {"b64": ...}).',
    )
    serve_parser.add_argument("model_dir", help="the model's folder, e.g. saved_models/digits_resnet20")
    serve_parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    serve_parser.add_argument(
        "--port",
        type=int,
        default=defaults.DEFAULT_PORT,
        help=f"port (default: {defaults.DEFAULT_PORT}, TF Serving's REST port)",
    )
    serve_parser.add_argument(
        "--max-batch",
        type=int,
        default=defaults.DEFAULT_MAX_BATCH,
        help=f"most instances per request (default: {defaults.DEFAULT_MAX_BATCH})",
    )
    serve_parser.add_argument(
        "--max-in-flight",
        type=int,
        default=defaults.DEFAULT_MAX_IN_FLIGHT,
        help="most prediction requests parsed, queued or running at once; past it, 503 with "
        f"Retry-After (default: {defaults.DEFAULT_MAX_IN_FLIGHT})",
    )
    serve_parser.add_argument(
        "--max-body-memory",
        type=int,
        default=defaults.DEFAULT_MAX_BODY_MEMORY,
        help="most mebibytes of prediction request bodies held at once, each counted as it arrives; "
        f"past it, 503 with Retry-After (default: {defaults.DEFAULT_MAX_BODY_MEMORY})",
    )
    serve_parser.add_argument(
        "--request-timeout",
        type=float,
        default=defaults.DEFAULT_REQUEST_TIMEOUT,
        help="seconds a request has to arrive whole, headers and body; past it, 408 and the "
        f"connection closed (default: {defaults.DEFAULT_REQUEST_TIMEOUT:g})",
    )
    serve_parser.add_argument(
        "--runtime",
        choices=("auto", "tensorflow", "onnxruntime"),
        default="auto",
        help="what runs the network: the SavedModel on TensorFlow, or the ONNX models of "
        "`export --format onnx|all` on onnxruntime (default auto: onnxruntime where the "
        "highest version has them and the onnx extra is installed)",
    )
    serve_parser.add_argument(
        "--precision",
        choices=contract.PRECISIONS["onnx"],
        default="float32",
        help="the ONNX models to serve: float32 (default), or int8 (`export --quantize int8`; onnxruntime only)",
    )
    serve_parser.add_argument(
        "--no-batching",
        dest="batching",
        action="store_false",
        help="run every request alone (by default, requests that wait while the network is "
        "busy run together as one batch)",
    )
    query = command("query", help="send image files to a TF Serving REST endpoint, print top-k classes")
    query.add_argument("images", nargs="+", help="image files (JPEG, PNG, GIF, BMP)")
    query.add_argument("--model", required=True, help="the served model's name")
    server = f"http://127.0.0.1:{defaults.DEFAULT_PORT}"
    query.add_argument("--server", default=server, help=f"default: {server}")
    query.add_argument(
        "--top-k",
        type=int,
        default=defaults.DEFAULT_TOP_K,
        help=f"classes to print per image (default: {defaults.DEFAULT_TOP_K})",
    )
    tune_parser = command(
        "tune",
        help="search the gates' bias b_g (Table 1) with keras-tuner, then train and test the best",
        description="Search b_g from 0 to -10 (step -1) for exclusive and shortcut-only gating with keras-tuner, "
        "on a validation split held out of the training set; train the best on the whole training set and "
        "test it. Running the same command again resumes the search.",
    )
    add_config_arguments(tune_parser, default_model="resnet110")
    tune_parser.add_argument("--output", default=os.path.join("runs", "tune"), help="default: runs/tune")
    tune_parser.add_argument(
        "--gatings",
        nargs="+",
        default=list(defaults.GATINGS),
        help="exclusive_gating and/or shortcut_only_gating (default: both)",
    )
    tune_parser.add_argument("--tuner", default="grid", choices=defaults.TUNER_NAMES, help="default: grid")
    tune_parser.add_argument("--trials", type=int, help="the most trials (default: the whole grid, 11 per gating)")
    tune_parser.add_argument(
        "--validation-examples",
        type=int,
        default=defaults.DEFAULT_VALIDATION_EXAMPLES,
        help=f"training images held out for the objective (default: {defaults.DEFAULT_VALIDATION_EXAMPLES})",
    )
    tune_parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="validation evaluations per trial (Hyperband's epochs, at least 3; default: 1)",
    )
    tune_parser.add_argument(
        "--no-retrain", action="store_true", help="skip training the best on the whole training set"
    )
    tune_parser.add_argument(
        "--gate-biases",
        type=int,
        nargs="+",
        metavar="B_G",
        help="the b_g values searched, some of 0 ... -10 (default: all eleven, the paper's)",
    )
    tune_parser.add_argument(
        "--chief",
        metavar="HOST:PORT",
        help="run as the chief of a search across processes: serve the grid at HOST:PORT "
        "to the workers, then write the results (keras-tuner's distributed mode)",
    )
    tune_parser.add_argument(
        "--worker", metavar="HOST:PORT", help="run as a worker: train the trials the chief at HOST:PORT hands out"
    )
    tune_parser.add_argument(
        "--worker-id",
        help="a worker's name, the same each time it starts: a worker started "
        "again takes back its trial and goes on from its last backup",
    )
    ablate = command(
        "ablate",
        help="train every variant of the paper's Table 1, 2 or 3 and set the results beside the paper's",
        description="Train every variant of a table of the paper for --seeds seeds and write the table (median, "
        "mean +- std of the final test error, the paper's figure beside) and the training curves of all "
        "variants. Running the same command again resumes.",
    )
    ablate.add_argument("--table", type=int, required=True, choices=[1, 2, 3])
    ablate.add_argument(
        "--models", nargs="+", help="networks in place of the table's (e.g. resnet20 for a small budget)"
    )
    ablate.add_argument("--datasets", nargs="+", choices=["cifar10", "cifar100"], help="only these columns")
    ablate.add_argument("--seeds", type=int, default=1, help="seeds per variant (the paper: 5; default: 1)")
    ablate.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a config field of every run, e.g. --set duration=2000 (the budget)",
    )
    ablate.add_argument("--data-dir", help="tensorflow-datasets data directory, or the root of an image folder")
    ablate.add_argument("--output", default=os.path.join("runs", "ablate"), help="default: runs/ablate")
    return main


def add_config_arguments(command, default_model):
    from .train import configs

    command.add_argument("--config", default="cifar10_paper", help="the recipe and data (default: cifar10_paper)")
    command.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a config field, e.g. --set duration=2000 (repeatable)",
    )
    command.add_argument("--model", default=default_model, help=f"the network (default: {default_model})")
    command.add_argument("--data-dir", help="tensorflow-datasets data directory, or the root of an image folder")
    command.add_argument(
        "--strategy", choices=configs.TENSORFLOW_STRATEGIES, help="tf.distribute strategy of each trial"
    )


# The flags of `train` and `tune` that set a config field of the same name, after --set.
CONFIG_FLAGS = ("model", "data_dir", "strategy")


def config_from(arguments):
    """The config that `train`'s or `tune`'s arguments name: --config, its --set overrides (text,
    parsed by each field's type), then the values of the flags `CONFIG_FLAGS`, as given."""
    from .train import configs

    config = configs.get_config(arguments.config, arguments.set)
    flags = {field: getattr(arguments, field) for field in CONFIG_FLAGS if getattr(arguments, field) is not None}
    return dataclasses.replace(config, **flags)
