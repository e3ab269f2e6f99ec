"""Training curves in the style of the paper's Fig. 1 and Fig. 6."""

import csv

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def read_log(csv_path):
    with open(csv_path) as file:
        return list(csv.DictReader(file))


def evaluated_split(rows):
    """ "validation" for a run that held out a validation split (and never read the test set), else "test"."""
    return "validation" if any(row.get("validation_error") for row in rows) else "test"


# The colours of the averages of the weights a log may hold, by the prefix of their columns.
AVERAGE_COLORS = {"average": "tab:green", "swa": "tab:purple"}


def training_curves(csv_path, png_path, title="", averages=None):
    """Test (or validation) error (%, solid, left axis) and training loss (dashed, right axis) against
    iterations, as the paper draws them, and the error of each average of the weights the run
    kept, labelled by `averages` ({column prefix: name}, `configs.AVERAGE_NAMES`; by its prefix where
    None). Returns `png_path`."""
    rows = read_log(csv_path)
    figure, error_axis = plt.subplots(figsize=(7, 4.5), dpi=120)
    loss_axis = error_axis.twinx()
    steps = [int(row["step"]) for row in rows]
    loss_axis.plot(
        steps, [float(row["loss"]) for row in rows], "--", color="tab:blue", linewidth=1, label="training loss"
    )
    split = evaluated_split(rows)
    evaluated = [row for row in rows if row[f"{split}_error"]]
    error_axis.plot(
        [int(row["step"]) for row in evaluated],
        [100 * float(row[f"{split}_error"]) for row in evaluated],
        "-",
        color="tab:red",
        linewidth=2,
        marker="o" if len(evaluated) < 30 else None,
        label=f"{split} error",
    )
    for kind, color in AVERAGE_COLORS.items():
        averaged = [row for row in evaluated if row.get(f"{kind}_{split}_error")]
        if averaged:  # a run that kept this average of the weights: its error beside the trained weights'
            error_axis.plot(
                [int(row["step"]) for row in averaged],
                [100 * float(row[f"{kind}_{split}_error"]) for row in averaged],
                "-",
                color=color,
                linewidth=1.5,
                marker="o" if len(averaged) < 30 else None,
                label=f"{split} error, {(averages or {}).get(kind, kind)}",
            )
    error_axis.set_xlabel("iterations")
    error_axis.set_ylabel(f"{split} error (%)")
    loss_axis.set_ylabel("training loss")
    error_axis.set_ylim(bottom=0)
    loss_axis.set_ylim(bottom=0)
    error_axis.grid(alpha=0.3)
    lines = error_axis.get_lines() + loss_axis.get_lines()
    error_axis.legend(lines, [line.get_label() for line in lines], loc="upper right")
    error_axis.set_title(title)
    figure.tight_layout()
    figure.savefig(png_path)
    plt.close(figure)
    return png_path


def time_to_accuracy(runs, png_path, title=""):
    """Evaluated error (%) against training hours, one line per run, for comparing schedules.

    Args:
        runs: {label: (log rows, hours per training step)}: each run's `read_log` rows and the
            time one step takes on the machine compared (the same measured rate for runs of
            the same network, so that stretches where a run shared the CPU do not count).
    Returns `png_path`.
    """
    figure, axis = plt.subplots(figsize=(7, 4.5), dpi=120)
    for label, (rows, hours_per_step) in runs.items():
        split = evaluated_split(rows)
        evaluated = [row for row in rows if row[f"{split}_error"]]
        axis.plot(
            [int(row["step"]) * hours_per_step for row in evaluated],
            [100 * float(row[f"{split}_error"]) for row in evaluated],
            "-",
            marker="o",
            markersize=3,
            linewidth=1.5,
            label=f"{label} ({split})",
        )
    axis.set_xlabel("training hours on this machine")
    axis.set_ylabel("error (%)")
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    axis.legend(loc="upper right")
    axis.set_title(title)
    figure.tight_layout()
    figure.savefig(png_path)
    plt.close(figure)
    return png_path
