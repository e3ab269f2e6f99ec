"""The gate-bias search's results (`tune.search`): its table beside Table 1's figures, as
Markdown and CSV, and its plot."""

import csv
import os

from . import GATE_BIASES, GATINGS
from .ablation import FAIL
from .ablation import GATE_BIAS_ERRORS as PAPER


def write_results(output, config, results, best, test_error, training_examples, validation_examples):
    gatings = [gating for gating in GATINGS if any(result[0] == gating for result in results)]
    scores = {(gating, bias): error for gating, bias, error in results}
    lines = [
        f"# Gate bias b_g: {config.model} on {config.dataset}",
        "",
        f"Validation error (%) on {validation_examples} images held out of the training set, after training "
        f"on the other {training_examples} for {config.duration:g} {config.schedule_unit}. The paper's "
        'figures are test errors of ResNet-110 on CIFAR-10 after its whole recipe (Table 1); "fail": above '
        "20 %.",
        "",
    ]
    header = ["b_g"] + [f"{gating.replace('_', ' ')}: {kind}" for gating in gatings for kind in ("ours", "paper")]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    rows = []
    for bias in GATE_BIASES:
        cells = [str(bias)]
        for gating in gatings:
            error, paper = scores.get((gating, bias)), PAPER[gating].get(bias)
            cells += ["-" if error is None else f"{error:.2f}", "-" if paper is None else str(paper)]
            if error is not None:
                rows.append(
                    dict(
                        gating=gating,
                        gate_bias=bias,
                        validation_error=round(error, 4),
                        paper_test_error="" if paper is None else paper,
                    )
                )
        lines.append("| " + " | ".join(cells) + " |")
    if best:
        lines += [
            "",
            f"Best: {best[0].replace('_', ' ')} at b_g = {best[1]}"
            + ("" if test_error is None else f"; trained on the whole training set, test error {test_error:.2f} %."),
        ]
    with open(os.path.join(output, "gate_bias.md"), "w") as file:
        file.write("\n".join(lines) + "\n")
    with open(os.path.join(output, "gate_bias.csv"), "w", newline="") as file:
        writer = csv.DictWriter(file, ["gating", "gate_bias", "validation_error", "paper_test_error"])
        writer.writeheader()
        writer.writerows(rows)
    plot(results, os.path.join(output, "gate_bias.png"), config)
    print("\n".join(lines))


def plot(results, png_path, config):
    """Validation error against b_g for each gating, the paper's test errors as open markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5), dpi=120)
    for index, gating in enumerate(GATINGS):
        ours = [(bias, error) for name, bias, error in results if name == gating]
        color = plt.cm.tab10(index)
        if ours:
            axis.plot(*zip(*ours), "-o", color=color, label=f"{gating.replace('_', ' ')} (ours, validation)")
        paper = [(bias, value) for bias, value in PAPER[gating].items() if value != FAIL]
        axis.plot(
            *zip(*paper),
            "s",
            markerfacecolor="none",
            color=color,
            markersize=9,
            label=f"{gating.replace('_', ' ')} (paper, test)",
        )
        failed = [bias for bias, value in PAPER[gating].items() if value == FAIL]
        if failed:
            axis.plot(failed, [20.5] * len(failed), "x", color=color, label="paper: fail (> 20 %)")
    axis.axhline(20, color="grey", linewidth=0.6, linestyle=":")
    axis.set(
        xlabel="gate bias b_g",
        ylabel="error (%)",
        title=f"Gate bias search, {config.model} on {config.dataset}",
        xticks=list(GATE_BIASES),
        ylim=(0, None),
    )
    axis.invert_xaxis()
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(png_path)
    plt.close(figure)
    return png_path
