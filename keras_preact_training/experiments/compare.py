"""`keras-preact compare`: finished runs side by side, error against training hours.

Used to pick the zoo's schedule: runs of the same network under different
schedules, each evaluated on a validation split held out of the training set, compared on
their final error and on the hours each needs to come within a margin of the best final
error. Hours are steps x batch / a measured training rate where one is given (runs that
shared the CPU with other jobs logged slower stretches that say nothing of the schedule),
else the run's own logged hours. Where runs kept averages of their weights
(`Config.average_momentum`, `Config.swa_start`), the table gives each average's final error
beside the trained weights': which weights to ship is chosen on the validation split too.
"""

import os

from .. import checked_files, plots
from ..train import configs as train_configs

# "Close to the best": within this many points of the lowest final error of the runs compared.
MARGIN_POINTS = 1.0
# Config fields that say where a run was read from or how often it logged, not its recipe:
# left out of the settings that tell the runs apart.
NOT_RECIPE = ("data_dir", "evaluate_every", "checkpoint_every", "log_every", "fused_batch_norm")


def load_run(run_dir):
    """(summary, log rows) of a finished run.

    Raises:
        FileNotFoundError: if `run_dir` holds no finished run.
    """
    paths = [os.path.join(run_dir, file) for file in ("summary.json", "log.csv")]
    if not all(os.path.isfile(path) for path in paths):
        raise FileNotFoundError(f"compare needs finished runs (summary.json and log.csv). Received: {run_dir!r}")
    return checked_files.read_json(paths[0], "train the run again, or restore the file"), plots.read_log(paths[1])


def differing_settings(configs):
    """For each config, "field=value" of the recipe's fields whose values differ among `configs`.

    A field a run's config.json lacks (the run predates it) had the `Config` default."""
    configs = [{**train_configs.field_defaults(), **config} for config in configs]
    fields = sorted({field for config in configs for field in config} - set(NOT_RECIPE))
    differing = [field for field in fields if len({repr(config.get(field)) for config in configs}) > 1]
    return [", ".join(f"{field}={config.get(field)}" for field in differing) for config in configs]


def compare(run_dirs, output, images_per_second=None, target=None):
    """Writes `time_to_accuracy.png` and `comparison.md` to `output`; returns the table's rows.

    Args:
        run_dirs: finished runs of `keras-preact train`.
        output: folder for the plot and the table.
        images_per_second: the measured training rate of the runs' network on this machine
            (default: each run's own logged hours).
        target: an error in percent: the table also gives the hours each run needs to
            reach it (its first evaluation at or below it).
    """
    if len(run_dirs) < 1:
        raise ValueError("compare needs at least one run directory. Received: none")
    if images_per_second is not None and not images_per_second > 0:
        raise ValueError(f"images_per_second must be positive. Received: {images_per_second!r}")
    if target is not None and not 0 < target < 100:
        raise ValueError(f"target must be an error in percent, between 0 and 100. Received: {target!r}")
    runs = {}
    for run_dir in run_dirs:
        summary, rows = load_run(run_dir)
        label = os.path.basename(os.path.normpath(run_dir))
        if images_per_second is None:
            hours_per_step = summary["training_hours"] / summary["steps"]
        else:
            hours_per_step = summary["config"]["batch_size"] / images_per_second / 3600
        runs[label] = (summary, rows, hours_per_step)
    split = {summary.get("evaluated_on", "test") for summary, _, _ in runs.values()}
    if len(split) != 1:
        raise ValueError(f"compare needs runs evaluated on the same split. Received: {sorted(split)}")
    split = split.pop()
    kept = [
        kind
        for kind in train_configs.AVERAGE_NAMES
        if any(f"{kind}_{split}_error" in summary for summary, *_ in runs.values())
    ]
    best = min(100 * summary[f"{split}_error"] for summary, _, _ in runs.values())
    settings = differing_settings([summary["config"] for summary, _, _ in runs.values()])
    table = []
    for (label, (summary, rows, hours_per_step)), setting in zip(runs.items(), settings):
        evaluated = [(int(row["step"]), 100 * float(row[f"{split}_error"])) for row in rows if row[f"{split}_error"]]
        close = next((step for step, error in evaluated if error <= best + MARGIN_POINTS), None)
        reached = next((step for step, error in evaluated if target is not None and error <= target), None)
        table.append(
            dict(
                run=label,
                schedule=summary["config"].get("schedule", "step"),
                duration=f"{summary['config']['duration']:g} {summary['config']['schedule_unit']}",
                settings=setting,
                error=100 * summary[f"{split}_error"],
                averages={
                    kind: 100 * summary[f"{kind}_{split}_error"] if f"{kind}_{split}_error" in summary else None
                    for kind in kept
                },
                hours=summary["steps"] * hours_per_step,
                hours_to_close=None if close is None else close * hours_per_step,
                hours_to_target=None if reached is None else reached * hours_per_step,
            )
        )
    checked_files.make_directory(output, "output folder")
    plots.time_to_accuracy(
        {label: (rows, hours_per_step) for label, (_, rows, hours_per_step) in runs.items()},
        os.path.join(output, "time_to_accuracy.png"),
        title=f"{split} error against hours",
    )
    target_column = "" if target is None else f" hours to {target:.2f} % |"
    average_columns = "".join(f" final {split} error, {train_configs.AVERAGE_NAMES[kind]} |" for kind in kept)
    lines = [
        f"| run | settings | duration | final {split} error |{average_columns} hours | hours to "
        f"{best + MARGIN_POINTS:.2f} % |" + target_column,
        "|---|---|---|---|---|---|" + "---|" * (len(kept) + (target is not None)),
    ]
    for row in table:
        hours = [row["hours_to_close"]] + ([row["hours_to_target"]] if target is not None else [])
        averages = "".join(" - |" if error is None else f" {error:.2f} % |" for error in row["averages"].values())
        lines.append(
            f"| {row['run']} | {row['settings']} | {row['duration']} | {row['error']:.2f} % |{averages} "
            f"{row['hours']:.2f} | "
            + " | ".join("not reached" if value is None else f"{value:.2f}" for value in hours)
            + " |"
        )
    with open(os.path.join(output, "comparison.md"), "w") as file:
        file.write("\n".join(lines) + "\n")
    return table
