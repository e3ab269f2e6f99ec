"""`keras-preact train`: train a network with a config of the paper's recipe, resuming from the
run folder's last checkpoint."""

import dataclasses
import json
import os
import statistics

from .arguments import check_config_data, config_from

HELP = "train a network (resumes from the run directory's last checkpoint)"
DESCRIPTION = (
    "Train a network with a config of the paper's recipe. Running the same command again "
    "resumes from the last checkpoint of its run directory."
)
TENSORFLOW = "optional"
BACKENDS = ("tensorflow", "jax", "torch")


def add_arguments(parser):
    from ..train import configs, named_configs

    parser.add_argument(
        "--config", default="digits_demo", help=f"one of {sorted(named_configs.CONFIGS)} (default: digits_demo)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a config field, e.g. --set model=resnet164 --set batch_size=64 "
        "(repeatable; `keras-preact configs` lists the fields)",
    )
    parser.add_argument("--model", help="shortcut for --set model=NAME")
    parser.add_argument("--data-dir", help="tensorflow-datasets data directory, or the root of an image folder")
    parser.add_argument(
        "--strategy",
        choices=configs.STRATEGIES,
        help="under TensorFlow, the tf.distribute strategy (multi_worker reads the cluster from TF_CONFIG); "
        "under KERAS_BACKEND=jax, default (one device) or data_parallel (every device of every process)",
    )
    parser.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        help="data_parallel over several processes: process 0's host and a free port (or "
        "KERAS_DISTRIBUTION_JOB_ADDRESSES), with --processes and --process-id",
    )
    parser.add_argument("--processes", type=int, help="the number of processes (or KERAS_DISTRIBUTION_NUM_PROCESSES)")
    parser.add_argument(
        "--process-id", type=int, help="this process's id, 0 to --processes - 1 (or KERAS_DISTRIBUTION_PROCESS_ID)"
    )
    parser.add_argument(
        "--run-dir", help="where checkpoints, logs, plots and the model go (default: runs/<config>-<model>)"
    )
    parser.add_argument(
        "--allow-config-changes",
        action="store_true",
        help="resume a run with settings other than those it started with (refused otherwise; "
        "data_dir, evaluate_every, checkpoint_every, log_every and fused_batch_norm may always "
        "change)",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="train this many seeds (0, 1, ...) and report "
        "the median and mean +- std of the final test error, as the paper does",
    )


check = check_config_data


def run_folder(arguments, model):
    """The run's folder: --run-dir, or runs/<config>-<model>."""
    return arguments.run_dir or os.path.join("runs", f"{arguments.config}-{model}")


def interrupted(arguments):
    """What Ctrl-C's line says: how the run goes on (a checkpoint is written whole or not at all)."""
    try:
        model = config_from(arguments).model
    except ValueError:
        model = arguments.model
    folder = run_folder(arguments, model)
    return (
        f": the run in {folder} keeps its last checkpoint; run the same command again to resume from it, "
        "nothing trained before that checkpoint is lost"
    )


def run(arguments):
    from ..train import data_parallel

    config = config_from(arguments)
    if config.strategy == "data_parallel":  # before any computation: JAX's distributed runtime first
        data_parallel.initialize(arguments.coordinator, arguments.processes, arguments.process_id)
    elif arguments.coordinator is not None or arguments.processes is not None or arguments.process_id is not None:
        raise ValueError(
            "--coordinator, --processes and --process-id are --strategy data_parallel's (under KERAS_BACKEND=jax). "
            f"Received: strategy={config.strategy!r}"
        )
    run_dir = run_folder(arguments, config.model)
    if arguments.seeds < 1:
        raise ValueError(f"--seeds must be at least 1. Received: --seeds {arguments.seeds}")
    train_seeds(config, run_dir, arguments.seeds, arguments.command_line, arguments.allow_config_changes)
    return 0


def train_seeds(config, run_dir, seeds, command=None, allow_config_changes=False):
    """Trains `seeds` seeds of `config` (in `run_dir`/seed<N> where more than one) and, for
    several, writes and prints their errors' median, mean and standard deviation."""
    from ..train import engines, loop

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
