"""`keras-preact`'s commands: `main` parses the command line (`command_line.parser`), checks
what can be checked before TensorFlow loads, and runs the command's function from `COMMANDS`;
bad input exits with 2, a diverged run with 3, a run whose checkpoints are all unreadable
with 4, a process of a data-parallel run whose peer ended with 5, each with one line that
says why."""

import dataclasses
import json
import os
import shlex
import statistics
import sys

from keras_preact import quiet_tensorflow

from .command_line import config_from, parser
from .data import cifar10_folder

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
# NumPy and Pillow, `keras_preact_training.data.input_numpy`); where it is installed they import it as the rest.
TENSORFLOW_OPTIONAL = ("train", "evaluate")


def check_model(config):
    """Raises ValueError for a model name that `keras_preact.MODELS` does not hold (imports Keras)."""
    import keras_preact

    if config.model not in keras_preact.MODELS:
        raise ValueError(f"Unknown model. Choose one of {keras_preact.list_models()}. Received: model={config.model!r}")


def train_seeds(config, run_dir, seeds, command=None, allow_config_changes=False):
    from .train import engines, loop

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
        data_parallel = sys.modules.get(f"{__package__}.data_parallel")
        if data_parallel and isinstance(error, data_parallel.PeerLost):
            print(f"error: {error}", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(5)  # at once: at a normal exit JAX's distributed runtime waits out its heartbeat, then aborts
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
        cifar10_folder.check_folder(cifar10_folder.or_default(arguments.data_dir))
    if arguments.command in ("train", "tune"):
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
        from .data import datasets

        if not datasets.tensorflow_installed():
            return
    if verbose:
        quiet_tensorflow.uninstall()
        import tensorflow  # noqa: F401

        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    quiet_tensorflow.load_quietly()


def train_command(arguments):
    from .train import data_parallel

    config = config_from(arguments)
    check_model(config)
    if config.strategy == "data_parallel":  # before any computation: JAX's distributed runtime first
        data_parallel.initialize(arguments.coordinator, arguments.processes, arguments.process_id)
    elif arguments.coordinator is not None or arguments.processes is not None or arguments.process_id is not None:
        raise ValueError(
            "--coordinator, --processes and --process-id are --strategy data_parallel's (under KERAS_BACKEND=jax). "
            f"Received: strategy={config.strategy!r}"
        )
    run_dir = arguments.run_dir or os.path.join("runs", f"{arguments.config}-{config.model}")
    if arguments.seeds < 1:
        raise ValueError(f"--seeds must be at least 1. Received: --seeds {arguments.seeds}")
    train_seeds(config, run_dir, arguments.seeds, arguments.command_line, arguments.allow_config_changes)
    return 0


def configs_command(arguments):
    from .train import configs

    names = [arguments.name] if arguments.name else list(configs.CONFIGS)
    print("\n\n".join("\n".join(configs.describe(name, every_field=bool(arguments.name))) for name in names))
    return 0


def zoo_command(arguments):
    from .experiments import zoo

    print(zoo.unit_comparison_table() if arguments.units else zoo.markdown_table())
    return 0


def diagnose_command(arguments):
    from .experiments import diagnose

    diagnose.diagnose(
        arguments.output, arguments.depths, arguments.depth, arguments.batch_size, arguments.data_dir, arguments.seed
    )
    print(f"Plots and tables in {arguments.output}.")
    return 0


def evaluate_command(arguments):
    from .train import evaluate

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
    already = cifar10_folder.is_made(arguments.data_dir)
    folder = cifar10_folder.extract(arguments.archive, arguments.data_dir)
    counts = cifar10_folder.counts(folder)
    print(
        f"{'Already made' if already else 'Made'}: {folder}, {counts['train'][0]:,} training and "
        f"{counts['test'][0]:,} test images in {counts['train'][1]} classes"
        + (f" (remove it and {folder}.done to make it again)." if already else ".")
    )
    return 0


def publish_command(arguments):
    from .experiments import zoo

    entry = zoo.publish(
        arguments.run_dir, arguments.name, arguments.data_dir, images_per_second=arguments.images_per_second
    )
    print(
        f"Published {arguments.name}: {entry['file']} ({entry['bytes'] / 2**20:.1f} MB, sha256 "
        f"{entry['sha256'][:16]}), test error {100 * entry['test_error']:.2f} %."
    )
    return 0


def compare_command(arguments):
    from .experiments import compare

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
    from . import export
    from .export import contract

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
    from .serving import client

    predictions = client.query(arguments.server, arguments.model, arguments.images, top_k=arguments.top_k)
    client.print_predictions(arguments.images, predictions)
    return 0


def tune_command(arguments):
    from .experiments import tune
    from .train import engines

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
    from .experiments import ablation

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
