"""`keras-preact ablate`: every variant of the paper's Table 1, 2 or 3 trained, and the table
set beside the paper's."""

import os

HELP = "train every variant of the paper's Table 1, 2 or 3 and set the results beside the paper's"
DESCRIPTION = (
    "Train every variant of a table of the paper for --seeds seeds and write the table (median, "
    "mean +- std of the final test error, the paper's figure beside) and the training curves of all "
    "variants. Running the same command again resumes."
)
TENSORFLOW = "always"
BACKENDS = ("tensorflow", "jax")


def add_arguments(parser):
    parser.add_argument("--table", type=int, required=True, choices=[1, 2, 3])
    parser.add_argument(
        "--models", nargs="+", help="networks in place of the table's (e.g. resnet20 for a small budget)"
    )
    parser.add_argument("--datasets", nargs="+", choices=["cifar10", "cifar100"], help="only these columns")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per variant (the paper: 5; default: 1)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a config field of every run, e.g. --set duration=2000 (the budget)",
    )
    parser.add_argument("--data-dir", help="tensorflow-datasets data directory, or the root of an image folder")
    parser.add_argument("--output", default=os.path.join("runs", "ablate"), help="default: runs/ablate")


def run(arguments):
    from ..experiments import ablation

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
