"""`keras-preact tune`: Table 1's search of the gates' bias b_g with keras-tuner, then the best
trained and tested."""

import os

from .. import experiments
from .arguments import check_config_data, config_from

HELP = "search the gates' bias b_g (Table 1) with keras-tuner, then train and test the best"
DESCRIPTION = (
    "Search b_g from 0 to -10 (step -1) for exclusive and shortcut-only gating with keras-tuner, "
    "on a validation split held out of the training set; train the best on the whole training set and "
    "test it. Running the same command again resumes the search."
)
TENSORFLOW = "always"
BACKENDS = ("tensorflow",)


def add_arguments(parser):
    from ..train import configs

    parser.add_argument("--config", default="cifar10_paper", help="the recipe and data (default: cifar10_paper)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a config field, e.g. --set duration=2000 (repeatable)",
    )
    parser.add_argument("--model", default="resnet110", help="the network (default: resnet110)")
    parser.add_argument("--data-dir", help="tensorflow-datasets data directory, or the root of an image folder")
    parser.add_argument(
        "--strategy", choices=configs.TENSORFLOW_STRATEGIES, help="tf.distribute strategy of each trial"
    )
    parser.add_argument("--output", default=os.path.join("runs", "tune"), help="default: runs/tune")
    parser.add_argument(
        "--gatings",
        nargs="+",
        default=list(experiments.GATINGS),
        help="exclusive_gating and/or shortcut_only_gating (default: both)",
    )
    parser.add_argument("--tuner", default="grid", choices=experiments.TUNER_NAMES, help="default: grid")
    parser.add_argument("--trials", type=int, help="the most trials (default: the whole grid, 11 per gating)")
    parser.add_argument(
        "--validation-examples",
        type=int,
        default=experiments.DEFAULT_VALIDATION_EXAMPLES,
        help=f"training images held out for the objective (default: {experiments.DEFAULT_VALIDATION_EXAMPLES})",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="validation evaluations per trial (Hyperband's epochs, at least 3; default: 1)",
    )
    parser.add_argument("--no-retrain", action="store_true", help="skip training the best on the whole training set")
    parser.add_argument(
        "--gate-biases",
        type=int,
        nargs="+",
        metavar="B_G",
        help="the b_g values searched, some of 0 ... -10 (default: all eleven, the paper's)",
    )
    parser.add_argument(
        "--chief",
        metavar="HOST:PORT",
        help="run as the chief of a search across processes: serve the grid at HOST:PORT "
        "to the workers, then write the results (keras-tuner's distributed mode)",
    )
    parser.add_argument(
        "--worker", metavar="HOST:PORT", help="run as a worker: train the trials the chief at HOST:PORT hands out"
    )
    parser.add_argument(
        "--worker-id",
        help="a worker's name, the same each time it starts: a worker started "
        "again takes back its trial and goes on from its last backup",
    )


check = check_config_data


def run(arguments):
    from ..experiments import tune_processes

    config = config_from(arguments)
    tune_processes.distribute(arguments.chief, arguments.worker, arguments.worker_id)  # before TensorFlow loads

    from ..experiments import tune
    from ..train import engines

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
