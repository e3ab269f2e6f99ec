"""`keras-preact`: train keras-preact networks with the paper's recipe.

    keras-preact train --config digits_demo                 # the main job, offline
    keras-preact train --config cifar10_paper --set model=resnet164 --seeds 5
    keras-preact train --config cifar10_paper --data-dir ~/tensorflow_datasets \\
        --strategy mirrored --set batch_size=256
    KERAS_BACKEND=jax keras-preact train --config cifar10_zoo --data-dir DIR   # on JAX, one device
    KERAS_BACKEND=torch keras-preact train --config cifar10_zoo --data-dir DIR # on PyTorch; no TensorFlow needed
    keras-preact configs                                    # the configs and their fields
    keras-preact data cifar10-jpeg.tar.xz                   # the CIFAR-10 image folder, from an archive
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
import json
import os
import shlex
import statistics
import sys

from keras_preact import quiet_tensorflow

from . import data_folder

# The Keras backends each command's computation runs on; under another one it stops at once
# with a message that says what runs there instead. Training (`train`) is TensorFlow's
# (tf.distribute) or JAX's or PyTorch's (one device); `ablate`'s runs TensorFlow's or JAX's;
# keras-tuner's trials (tf.distribute) and SavedModels are TensorFlow's alone.
BACKENDS = {
    "train": ("tensorflow", "jax", "torch"),
    "ablate": ("tensorflow", "jax"),
    "tune": ("tensorflow",),
    "export": ("tensorflow",),
}
# Commands that never import TensorFlow (they answer at once), or import it only where they
# need it (serve: the onnxruntime runtime never does).
WITHOUT_TENSORFLOW = ("configs", "compare", "data", "query", "serve")
# Commands that run without TensorFlow under KERAS_BACKEND=jax or torch (images read with
# NumPy and Pillow, `keras_preact_training.input_numpy`); where it is installed they import it as the rest.
TENSORFLOW_OPTIONAL = ("train", "evaluate")


def parser():
    from . import configs, contract, defaults

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
        help="tf.distribute strategy; multi_worker reads the cluster from TF_CONFIG "
        "(under KERAS_BACKEND=jax: default or one_device, one device)",
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
        f"{data_folder.CIFAR10_FOLDER}), or tensorflow-datasets' data directory",
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
        description="Extract an archive of an image folder (train/<class>/<image> and test/<class>/<image>; "
        "CIFAR-10 as JPEGs, as the zoo trained on) into the folder that `keras-preact evaluate` reads by default "
        f"({data_folder.CIFAR10_FOLDER}), or into --data-dir; once: a folder already made is left as it is.",
    )
    data_parser.add_argument("archive", help="a .tar, .tar.gz, .tar.xz or .zip of the image folder")
    data_parser.add_argument(
        "--data-dir",
        default=data_folder.CIFAR10_FOLDER,
        help=f"where the folder goes (default: {data_folder.CIFAR10_FOLDER})",
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
    from . import configs

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
    command.add_argument("--strategy", choices=configs.STRATEGIES, help="tf.distribute strategy of each trial")


# The flags of `train` and `tune` that set a config field of the same name, after --set.
CONFIG_FLAGS = ("model", "data_dir", "strategy")


def config_from(arguments):
    """The config that `train`'s or `tune`'s arguments name: --config, its --set overrides (text,
    parsed by each field's type), then the values of the flags `CONFIG_FLAGS`, as given."""
    from . import configs

    config = configs.get_config(arguments.config, arguments.set)
    flags = {field: getattr(arguments, field) for field in CONFIG_FLAGS if getattr(arguments, field) is not None}
    return dataclasses.replace(config, **flags)


def check_model(config):
    """Raises ValueError for a model name that `keras_preact.MODELS` does not hold (imports Keras)."""
    import keras_preact

    if config.model not in keras_preact.MODELS:
        raise ValueError(f"Unknown model. Choose one of {keras_preact.list_models()}. Received: model={config.model!r}")


def train_seeds(config, run_dir, seeds, command=None, allow_config_changes=False):
    from . import engines, loop

    engines.configure(config)
    summaries = []
    for seed in range(seeds):
        seeded = dataclasses.replace(config, seed=config.seed + seed)
        directory = run_dir if seeds == 1 else os.path.join(run_dir, f"seed{seeded.seed}")
        summaries.append(loop.train(seeded, directory, command=command, allow_config_changes=allow_config_changes))
    if seeds > 1:
        errors = [100 * summary[f"{summary['evaluated_on']}_error"] for summary in summaries]
        result = dict(
            seeds=seeds,
            test_errors=errors,
            median=statistics.median(errors),
            mean=statistics.mean(errors),
            std=statistics.stdev(errors),
        )
        with open(os.path.join(run_dir, "seeds.json"), "w") as file:
            json.dump(result, file, indent=2)
        print(
            f"Final test error over {seeds} seeds: median {result['median']:.2f} %, "
            f"mean {result['mean']:.2f} +- {result['std']:.2f} %."
        )
    return summaries


def main(argv=None):
    arguments = parser().parse_args(argv)
    try:
        check_data_folder(arguments)
        if arguments.command not in WITHOUT_TENSORFLOW:
            import_tensorflow(arguments.verbose, optional=arguments.command in TENSORFLOW_OPTIONAL)
        if arguments.command in BACKENDS:
            check_backend(arguments.command)
        arguments.command_line = "keras-preact " + shlex.join(sys.argv[1:] if argv is None else argv)
        return COMMANDS[arguments.command](arguments)
    except Exception as error:
        # Bad input exits with 2, a diverged run with 3, a run whose checkpoints are all
        # unreadable with 4, each with its message alone (only a
        # command that trains has imported the loop and its checkpoints).
        loop = sys.modules.get(f"{__package__}.loop")
        checkpoints = sys.modules.get(f"{__package__}.checkpoints")
        exit_codes = {
            ValueError: 2,
            # Files and folders that are missing, in the way or unreadable; servers that do not answer.
            OSError: 2,
            ImportError: 2,
            **({loop.TrainingDiverged: 3} if loop else {}),
            **({checkpoints.CheckpointsUnreadable: 4} if checkpoints else {}),
        }
        code = next((code for kind, code in exit_codes.items() if isinstance(error, kind)), None)
        if code is None:
            raise
        if isinstance(error, ModuleNotFoundError) and error.name == "tensorflow":
            error = (
                f"TensorFlow, Keras' backend here (KERAS_BACKEND={os.environ.get('KERAS_BACKEND', 'unset')}), "
                "is not installed. Install it (pip install 'keras-preact[tensorflow]'), or set "
                "KERAS_BACKEND=jax or torch: train and evaluate run there without it."
            )
        print(f"error: {error}", file=sys.stderr)
        return code


def check_data_folder(arguments):
    """The image folder that `train`, `tune` or `evaluate` would read, checked before TensorFlow
    loads: a FileNotFoundError in a second, which says how a folder is laid out and made; and
    a warning for a data directory given to the embedded digits, which read none (a warning,
    not an error: the queues pass their data directory to every run they start)."""
    if arguments.command == "evaluate" and arguments.dataset == "folder":
        data_folder.check_folder(data_folder.or_default(arguments.data_dir))
    if arguments.command in ("train", "tune"):
        config = config_from(arguments)
        if config.dataset == "folder":
            data_folder.check_folder(config.data_dir)
        if config.dataset == "digits" and config.data_dir is not None:
            print(
                f"warning: data_dir={config.data_dir!r} is not read: the digits are embedded in scikit-learn "
                "(--data-dir is read by the data sets of files: folder, cifar10, cifar100, imagenet2012).",
                file=sys.stderr,
                flush=True,
            )


def check_backend(command):
    """Raises ValueError where Keras runs on a backend that `command` does not run on (`BACKENDS`)."""
    import keras

    if keras.backend.backend() in BACKENDS[command]:
        return
    if "jax" in BACKENDS[command]:
        raise ValueError(
            f"keras-preact {command} runs on Keras' TensorFlow backend (tf.distribute) or on JAX (one device). "
            f"Received: KERAS_BACKEND={keras.backend.backend()}. Set KERAS_BACKEND=tensorflow or jax (on a GPU: "
            f"TensorFlow's CUDA build, pip install 'keras-preact[gpu]', or JAX's, pip install 'jax[cuda12]'); "
            f"train, evaluate and the model functions run on every backend."
        )
    raise ValueError(
        f"keras-preact {command} runs on Keras' TensorFlow backend (tf.distribute, SavedModels). Received: "
        f"KERAS_BACKEND={keras.backend.backend()}. Unset KERAS_BACKEND (on a GPU: pip install "
        f"'keras-preact[gpu]', TensorFlow's CUDA build); ablate runs on JAX too, and train, evaluate and the "
        f"model functions on every backend."
    )


def import_tensorflow(verbose, optional=False):
    """Imports TensorFlow, quietly unless `verbose`: its C++ log lines below FATAL are off
    (`TF_CPP_MIN_LOG_LEVEL=3`, unless set), and the lines its libraries write while they load
    and find their devices (CUDA probing, oneDNN notices, which no log level silences) are held
    and shown only if the import fails (keras_preact.quiet_tensorflow). `optional`: where
    TensorFlow is not installed, nothing happens (the command runs without it or says why it
    cannot)."""
    if optional:
        from . import data

        if not data.tensorflow_installed():
            return
    if verbose:
        quiet_tensorflow.uninstall()
        import tensorflow  # noqa: F401

        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    quiet_tensorflow.load_quietly()


def train_command(arguments):
    config = config_from(arguments)
    check_model(config)
    run_dir = arguments.run_dir or os.path.join("runs", f"{arguments.config}-{config.model}")
    if arguments.seeds < 1:
        raise ValueError(f"--seeds must be at least 1. Received: --seeds {arguments.seeds}")
    train_seeds(config, run_dir, arguments.seeds, arguments.command_line, arguments.allow_config_changes)
    return 0


def configs_command(arguments):
    from . import configs

    names = [arguments.name] if arguments.name else list(configs.CONFIGS)
    print("\n\n".join("\n".join(configs.describe(name, every_field=bool(arguments.name))) for name in names))
    return 0


def zoo_command(arguments):
    from . import zoo

    print(zoo.unit_comparison_table() if arguments.units else zoo.markdown_table())
    return 0


def diagnose_command(arguments):
    from . import diagnose

    diagnose.diagnose(
        arguments.output, arguments.depths, arguments.depth, arguments.batch_size, arguments.data_dir, arguments.seed
    )
    print(f"Plots and tables in {arguments.output}.")
    return 0


def evaluate_command(arguments):
    from . import evaluate

    result = evaluate.evaluate(
        arguments.model,
        arguments.weights,
        arguments.dataset,
        arguments.data_dir,
        arguments.batch_size,
        arguments.flip,
        arguments.split,
    )
    print("\n".join(evaluate.report(arguments.model, arguments.weights, result)))
    return 0


def data_command(arguments):
    already = data_folder.is_made(arguments.data_dir)
    folder = data_folder.extract(arguments.archive, arguments.data_dir)
    counts = data_folder.counts(folder)
    print(
        f"{'Already made' if already else 'Made'}: {folder}, {counts['train'][0]:,} training and "
        f"{counts['test'][0]:,} test images in {counts['train'][1]} classes"
        + (f" (remove it and {folder}.done to make it again)." if already else ".")
    )
    return 0


def publish_command(arguments):
    from . import zoo

    entry = zoo.publish(
        arguments.run_dir, arguments.name, arguments.data_dir, images_per_second=arguments.images_per_second
    )
    print(
        f"Published {arguments.name}: {entry['file']} ({entry['bytes'] / 2**20:.1f} MB, sha256 "
        f"{entry['sha256'][:16]}), test error {100 * entry['test_error']:.2f} %."
    )
    return 0


def compare_command(arguments):
    from . import compare

    table = compare.compare(arguments.run_dirs, arguments.output, arguments.images_per_second, arguments.target)
    for row in table:
        print(
            f"{row['run']}: {row['schedule']} schedule, {row['duration']}, final error {row['error']:.2f} %, "
            f"{row['hours']:.2f} hours"
        )
    print(f"Plot and table in {arguments.output} (time_to_accuracy.png, comparison.md).")
    return 0


def export_command(arguments):
    """Exports a run or shipped weights, reloads the SavedModel and prints its classes of images."""
    from . import contract, export

    if (arguments.run_dir is None) == (arguments.model is None) or (arguments.model is None) != (
        arguments.weights is None
    ):
        raise ValueError(
            "export needs either --run-dir (a finished run) or --model with --weights (shipped "
            f"weights). Received: --run-dir {arguments.run_dir}, --model {arguments.model}, "
            f"--weights {arguments.weights}"
        )
    if arguments.name is not None:
        export.checked_name(arguments.name)
    images = export.read_image_files(arguments.images or [])
    formats = export.FORMATS[arguments.format]
    if "int8" not in arguments.quantize and arguments.calibration_images:
        raise ValueError(
            "--calibration-images calibrate int8 only: add --quantize int8. Received: --quantize "
            f"{' '.join(arguments.quantize) or '(none)'}"
        )
    quantized = dict(precisions=("float32", *arguments.quantize), calibration_images=arguments.calibration_images)
    if arguments.run_dir is not None:
        path = export.export_run(
            arguments.run_dir,
            arguments.output,
            arguments.name,
            arguments.version,
            arguments.top_k,
            formats=formats,
            fold_batch_norms=arguments.fold,
            **quantized,
        )
    else:
        path = export.export_shipped(
            arguments.model,
            arguments.weights,
            arguments.output,
            arguments.name,
            arguments.version,
            arguments.top_k,
            formats=formats,
            fold_batch_norms=arguments.fold,
            **quantized,
        )
    metadata = contract.read_metadata(path)
    if "onnx" in formats:
        onnx_files = [*metadata["onnx"]["files"].values()]
        for precision in metadata["onnx"].get("quantized", {}):
            onnx_files += contract.onnx_models(metadata, precision)["files"].values()
        print(f"ONNX models (checked with onnxruntime against the network): {', '.join(onnx_files)} in {path}")
    if "litert" in formats:
        print(
            "LiteRT models (checked with LiteRT's interpreter against the network): "
            f"{', '.join(metadata['litert']['files'].values())} in {path}"
        )
    if "saved_model" not in formats:
        return 0
    if arguments.images:
        width = max(len(image) for image in arguments.images)
        print("The reloaded SavedModel's classes:")
        for image, ranked in zip(arguments.images, export.classify(path, images)):
            print(f"  {image:<{width}}  " + ", ".join(f"{name} {score:.1%}" for name, score in ranked[:3]))
    elif arguments.run_dir is not None:
        image, label = export.example_image(arguments.run_dir)
        outputs = export.predict_encoded(path, [image])
        ranked = ", ".join(
            f"{name.decode()} {score:.1%}" for name, score in zip(outputs["classes"][0], outputs["scores"][0])
        )
        print(f"The reloaded SavedModel on the first test image (a {label!r}, {len(image)} bytes encoded): {ranked}.")
    return 0


def serve_command(arguments):
    from .serving import server

    if not server.serves_onnx(arguments.model_dir, arguments.runtime, arguments.precision):
        import_tensorflow(arguments.verbose)
    server.serve(
        arguments.model_dir,
        arguments.host,
        arguments.port,
        arguments.max_batch,
        arguments.verbose,
        arguments.max_in_flight,
        arguments.request_timeout,
        arguments.batching,
        arguments.runtime,
        arguments.precision,
        arguments.max_body_memory,
    )
    return 0


def query_command(arguments):
    from . import client

    predictions = client.query(arguments.server, arguments.model, arguments.images, top_k=arguments.top_k)
    client.print_predictions(arguments.images, predictions)
    return 0


def tune_command(arguments):
    from . import engines, tune

    config = config_from(arguments)
    check_model(config)
    tune.distribute(arguments.chief, arguments.worker, arguments.worker_id)
    engines.configure(config)
    result = tune.search(
        config,
        arguments.output,
        arguments.gatings,
        arguments.tuner,
        arguments.trials,
        arguments.validation_examples,
        arguments.rounds,
        retrain=not arguments.no_retrain,
        gate_biases=arguments.gate_biases or tune.GATE_BIASES,
    )
    if result["results"] is not None:
        print(f"Table and plot in {arguments.output} (gate_bias.md, gate_bias.csv, gate_bias.png).")
    return 0


def ablate_command(arguments):
    from . import ablation

    ablation.run(
        arguments.table,
        arguments.output,
        arguments.seeds,
        arguments.models,
        arguments.datasets,
        arguments.set,
        arguments.data_dir,
    )
    print(f"Table and curves in {arguments.output} (table{arguments.table}.md, .csv, _curves.png).")
    return 0


# Every command and the function that runs it: `main` dispatches through this table alone.
COMMANDS = {
    "train": train_command,
    "configs": configs_command,
    "data": data_command,
    "evaluate": evaluate_command,
    "zoo": zoo_command,
    "publish": publish_command,
    "compare": compare_command,
    "export": export_command,
    "serve": serve_command,
    "query": query_command,
    "tune": tune_command,
    "ablate": ablate_command,
    "diagnose": diagnose_command,
}
