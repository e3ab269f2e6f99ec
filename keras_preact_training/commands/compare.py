"""`keras-preact compare`: finished runs side by side, error against training hours."""

import os

HELP = "finished runs side by side: final error, hours, a time-to-accuracy plot"
DESCRIPTION = (
    "Compare finished runs (e.g. one network under different schedules, evaluated on a "
    "validation split): write time_to_accuracy.png (error against training hours) and comparison.md "
    "(final error, hours, hours to come within a point of the best) to --output."
)
TENSORFLOW = "never"
BACKENDS = None


def add_arguments(parser):
    parser.add_argument("run_dirs", nargs="+", help="finished runs of `keras-preact train`")
    parser.add_argument("--output", default=os.path.join("runs", "compare"), help="default: runs/compare")
    parser.add_argument(
        "--images-per-second",
        type=float,
        help="the runs' measured training rate on this machine, for their hours (default: "
        "each run's logged hours, which count stretches that shared the CPU)",
    )
    parser.add_argument(
        "--target", type=float, help="an error in percent: the table adds the hours each run needs to reach it"
    )


def run(arguments):
    from ..experiments import compare
    from ..train import configs

    table = compare.compare(arguments.run_dirs, arguments.output, arguments.images_per_second, arguments.target)
    for row in table:
        averages = ", ".join(
            f"{configs.AVERAGE_NAMES[kind]} {error:.2f} %"
            for kind, error in row["averages"].items()
            if error is not None
        )
        print(
            f"{row['run']}: {row['schedule']} schedule, {row['duration']}, final error {row['error']:.2f} %"
            f"{f' ({averages})' if averages else ''}, {row['hours']:.2f} hours"
        )
    print(f"Plot and table in {arguments.output} (time_to_accuracy.png, comparison.md).")
    return 0
