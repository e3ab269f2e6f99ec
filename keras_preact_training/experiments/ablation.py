"""`keras-preact ablate --table 1|2|3`: the paper's Tables 1-3, trained and set beside its figures.

Each table is data: rows (variants, as `Config` overrides) and the networks and data
sets they run on, with the paper's test error for each cell. The runner trains every
cell for every seed with `keras_preact_training.train.loop.train` (each run resumes from its checkpoints,
and a finished run is read back, so an interrupted ablation goes on where it stopped),
then writes `table<N>.md` and `table<N>.csv` (median and mean +- std final-epoch test
error next to the paper's) and `table<N>_curves.png` (test error and training loss of
every variant, as the paper's Fig. 3 and Fig. 6).

The paper's budget is its recipe: `cifar10_paper`/`cifar100_paper` as they are (64k
iterations, 5 seeds). A smaller budget (`--set duration=...`, `--set train_examples=...`,
`--models resnet20`) runs on a laptop CPU; its table says that its numbers are not
comparable with the paper's.
"""

import csv
import dataclasses
import os
import re
import statistics

import keras_preact

from .. import checked_files, plots
from ..train import named_configs

# The paper reports a run whose test error exceeds 20 % as "fail" (Table 1).
FAIL_ERROR = 20.0
FAIL = "fail"


@dataclasses.dataclass(frozen=True)
class Row:
    """One variant: its label as the paper writes it, its config overrides, and the
    paper's test error (%, or FAIL) per (dataset, model) cell."""

    label: str
    settings: tuple
    paper: dict


@dataclasses.dataclass(frozen=True)
class Table:
    title: str
    cells: tuple  # (dataset, model) pairs, the table's columns
    rows: tuple

    def paper_error(self, row, dataset, model):
        return row.paper.get((dataset, model))


ORIGINAL = "unit=original"
# Table 1's gated shortcuts on ResNet-110, CIFAR-10: test error (%) by gate bias b_g
# (the `tune` command's search sets its results beside these). Exclusive gating fails
# for b_g = 0 ... -5.
GATE_BIAS_ERRORS = {
    "exclusive_gating": {**{bias: FAIL for bias in range(0, -6, -1)}, -6: 8.70, -7: 9.81},
    "shortcut_only_gating": {0: 12.86, -6: 6.91},
}
TABLES = {
    # Table 1: shortcut variants (Fig. 2) on the original ResNet-110, CIFAR-10. Exclusive
    # gating fails for b_g = 0 ... -5 (the paper lists the range); 0 stands for them.
    1: Table(
        "Table 1: shortcut types, ResNet-110 (original units), CIFAR-10",
        (("cifar10", "resnet110"),),
        (
            Row("original (identity shortcut)", (ORIGINAL,), {("cifar10", "resnet110"): 6.61}),
            Row(
                "constant scaling 0 / 1 (plain)",
                (ORIGINAL, "merge=constant_scaling", "scaling=0,1"),
                {("cifar10", "resnet110"): FAIL},
            ),
            Row(
                "constant scaling 0.5 / 1",
                (ORIGINAL, "merge=constant_scaling", "scaling=0.5,1"),
                {("cifar10", "resnet110"): FAIL},
            ),
            Row(
                "constant scaling 0.5 / 0.5",
                (ORIGINAL, "merge=constant_scaling", "scaling=0.5,0.5"),
                {("cifar10", "resnet110"): 12.35},
            ),
            *(
                Row(
                    f"{label}, b_g = {bias}",
                    (ORIGINAL, f"merge={gating}", f"gate_bias={bias}"),
                    {("cifar10", "resnet110"): GATE_BIAS_ERRORS[gating][bias]},
                )
                for gating, label, biases in (
                    ("exclusive_gating", "exclusive gating", (0, -6, -7)),
                    ("shortcut_only_gating", "shortcut-only gating", (0, -6)),
                )
                for bias in biases
            ),
            Row("1x1 conv shortcut", (ORIGINAL, "shortcut=projection"), {("cifar10", "resnet110"): 12.22}),
            Row(
                "dropout shortcut (ratio 0.5)",
                (ORIGINAL, "merge=shortcut_dropout", "shortcut_dropout=0.5"),
                {("cifar10", "resnet110"): FAIL},
            ),
        ),
    ),
    # Table 2: activation placements (Fig. 4), CIFAR-10, ResNet-110 and ResNet-164.
    2: Table(
        "Table 2: activation placements, CIFAR-10",
        (("cifar10", "resnet110"), ("cifar10", "resnet164")),
        tuple(
            Row(label, (f"unit={unit}",), {("cifar10", "resnet110"): deep, ("cifar10", "resnet164"): bottleneck})
            for label, unit, deep, bottleneck in (
                ("original, Fig. 4(a)", "original", 6.61, 5.93),
                ("BN after addition, Fig. 4(b)", "bn_after_addition", 8.17, 6.50),
                ("ReLU before addition, Fig. 4(c)", "relu_before_addition", 7.84, 6.14),
                ("ReLU-only pre-activation, Fig. 4(d)", "relu_only_preactivation", 6.71, 5.91),
                ("full pre-activation, Fig. 4(e)", "preactivation", 6.37, 5.46),
            )
        ),
    ),
    # Table 3: original against pre-activation units, CIFAR-10 and CIFAR-100.
    3: Table(
        "Table 3: original vs pre-activation units",
        (
            ("cifar10", "resnet110_1layer"),
            ("cifar10", "resnet110"),
            ("cifar10", "resnet164"),
            ("cifar10", "resnet1001"),
            ("cifar100", "resnet164"),
            ("cifar100", "resnet1001"),
        ),
        (
            Row(
                "original unit",
                (ORIGINAL,),
                {
                    ("cifar10", "resnet110_1layer"): 9.90,
                    ("cifar10", "resnet110"): 6.61,
                    ("cifar10", "resnet164"): 5.93,
                    ("cifar10", "resnet1001"): 7.61,
                    ("cifar100", "resnet164"): 25.16,
                    ("cifar100", "resnet1001"): 27.82,
                },
            ),
            Row(
                "pre-activation unit",
                ("unit=preactivation",),
                {
                    ("cifar10", "resnet110_1layer"): 8.91,
                    ("cifar10", "resnet110"): 6.37,
                    ("cifar10", "resnet164"): 5.46,
                    ("cifar10", "resnet1001"): 4.92,
                    ("cifar100", "resnet164"): 24.33,
                    ("cifar100", "resnet1001"): 22.71,
                },
            ),
        ),
    ),
}
PAPER_CONFIGS = {"cifar10": "cifar10_paper", "cifar100": "cifar100_paper"}
PAPER_SEEDS = 5


@dataclasses.dataclass
class Cell:
    row: Row
    dataset: str
    model: str  # the network trained; `paper_model` is the table's
    paper_model: str
    errors: list = dataclasses.field(default_factory=list)  # % per seed
    run_dirs: list = dataclasses.field(default_factory=list)


def cells(table, models=None, datasets=None):
    """The (row, column) cells to train; `models` replaces the table's networks (one
    column per table network and replacement, e.g. resnet110 -> resnet20)."""
    chosen = []
    for dataset, paper_model in table.cells:
        if datasets and dataset not in datasets:
            continue
        for model in models or [paper_model]:
            if (dataset, model, paper_model) not in chosen:
                chosen.append((dataset, model, paper_model))
    return [Cell(row, dataset, model, paper_model) for row in table.rows for dataset, model, paper_model in chosen]


def configuration(cell, seed, overrides, data_dir=None):
    base = named_configs.get_config(PAPER_CONFIGS[cell.dataset])
    config = base.override(f"model={cell.model}", *cell.row.settings, *overrides)
    if data_dir:
        config = config.override(f"data_dir={data_dir}")
    return dataclasses.replace(config, seed=config.seed + seed)


def slug(text):
    """A folder name for a row label: "original, Fig. 4(a)" -> "original_fig_4_a"."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def run(table_number, output, seeds=1, models=None, datasets=None, overrides=(), data_dir=None, verbose=True):
    """Trains every cell of a table for `seeds` seeds and writes its table and plot.

    Returns:
        The cells, with their test errors (%).

    Raises:
        ValueError: for an unknown table or model, or a bad override, before anything is
            read or trained.
    """
    from ..train import engines, loop

    if table_number not in TABLES:
        raise ValueError(f"table must be one of {sorted(TABLES)}. Received: table={table_number!r}")
    if not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds must be a positive integer. Received: seeds={seeds!r}")
    unknown = [model for model in models or () if model not in keras_preact.MODELS]
    if unknown:  # before a data set is read, or downloaded
        raise ValueError(f"Unknown model. Choose one of {keras_preact.list_models()}. Received: models={unknown!r}")
    table = TABLES[table_number]
    chosen = cells(table, models, datasets)
    if not chosen:
        raise ValueError(
            f"No cell of table {table_number} on datasets {datasets}. The table has "
            f"{sorted({dataset for dataset, _ in table.cells})}."
        )
    for cell in chosen:  # every config checked before the first run starts
        configuration(cell, 0, overrides, data_dir)
    engines.configure(configuration(chosen[0], 0, overrides, data_dir))
    # Columns that put one network in place of several share its runs.
    trainings = list(dict.fromkeys((cell.dataset, cell.model, cell.row.label) for cell in chosen))
    for cell in chosen:
        for seed in range(seeds):
            config = configuration(cell, seed, overrides, data_dir)
            run_dir = os.path.join(
                output, f"table{table_number}", cell.dataset, cell.model, slug(cell.row.label), f"seed{config.seed}"
            )
            summary_path = os.path.join(run_dir, "summary.json")
            if os.path.exists(summary_path):  # finished before, or by another column: read back
                summary = checked_files.read_json(summary_path, "delete its run folder to train it again")
            else:
                if verbose:
                    number = trainings.index((cell.dataset, cell.model, cell.row.label)) * seeds + seed + 1
                    print(
                        f"[{number}/{len(trainings) * seeds}] {cell.row.label}: {cell.model} on "
                        f"{cell.dataset}, seed {config.seed}",
                        flush=True,
                    )
                summary = loop.train(config, run_dir, verbose=verbose)
            cell.errors.append(100 * summary["test_error"])
            cell.run_dirs.append(run_dir)
    budget = budget_note(configuration(chosen[0], 0, overrides, data_dir), seeds, models)
    write_tables(table_number, table, chosen, output, budget)
    plot_curves(table, chosen, os.path.join(output, f"table{table_number}_curves.png"))
    return chosen


def budget_note(config, seeds, models):
    """Empty at the paper's budget; otherwise says why the numbers are not the paper's."""
    paper = named_configs.get_config(PAPER_CONFIGS.get(config.dataset, "cifar10_paper"))
    differences = []
    for field in ("duration", "schedule_unit", "decay_boundaries", "batch_size", "train_examples", "test_examples"):
        ours, theirs = getattr(config, field), getattr(paper, field)
        if ours != theirs:
            differences.append(
                f"{field}={ours:g} (paper: {theirs:g})"
                if isinstance(ours, float)
                else f"{field}={ours} (paper: {theirs})"
            )
    if seeds != PAPER_SEEDS:
        differences.append(f"{seeds} seed(s) (paper: median of {PAPER_SEEDS})")
    if models:
        differences.append(f"networks {', '.join(models)} in place of the paper's")
    if not differences:
        return ""
    return "**A small budget: these numbers are not comparable with the paper's.** " + "; ".join(differences) + "."


def describe(errors):
    """(median, mean, std) of the errors; std is 0 for a single seed."""
    return statistics.median(errors), statistics.mean(errors), statistics.stdev(errors) if len(errors) > 1 else 0.0


def shown(error, fail_above=True):
    """An error as the paper shows it: "fail" above 20 % at the paper's budget (with the
    number beside); at a smaller budget, where every error may be high, the number alone."""
    if error == FAIL or error is None:
        return error or "-"
    return f"fail ({error:.2f})" if fail_above and error > FAIL_ERROR else f"{error:.2f}"


def write_tables(table_number, table, chosen, output, budget):
    """One column group per trained (dataset, network): median, mean ± std, and the
    paper's error for each of the table's networks it stands for."""
    groups = {}
    for cell in chosen:
        papers = groups.setdefault((cell.dataset, cell.model), [])
        if cell.paper_model not in papers:
            papers.append(cell.paper_model)
    lines = [f"# {table.title}", ""]
    if budget:
        lines += [budget, ""]
    header = ["variant"]
    for (dataset, model), papers in groups.items():
        header += [f"{model} {dataset}: median", "mean ± std"]
        header += [f"paper ({paper})" if paper != model else "paper" for paper in papers]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    records = []
    for row in table.rows:
        entries = [row.label]
        for (dataset, model), papers in groups.items():
            cell = next(cell for cell in chosen if (cell.row, cell.dataset, cell.model) == (row, dataset, model))
            median, mean, std = describe(cell.errors)
            entries += [shown(median, not budget), f"{mean:.2f} ± {std:.2f}"]
            for paper_model in papers:
                paper = table.paper_error(row, dataset, paper_model)
                entries.append(shown(paper))
                records.append(
                    dict(
                        table=table_number,
                        variant=row.label,
                        dataset=dataset,
                        model=model,
                        paper_model=paper_model,
                        seeds=len(cell.errors),
                        median=round(median, 4),
                        mean=round(mean, 4),
                        std=round(std, 4),
                        failed=median > FAIL_ERROR,
                        errors=" ".join(f"{error:.4f}" for error in cell.errors),
                        paper=paper,
                    )
                )
        lines.append("| " + " | ".join(entries) + " |")
    lines += [
        "",
        f'Test error (%) of the final model, over {len(chosen[0].errors)} seed(s); "fail": above '
        f"{FAIL_ERROR:.0f} %, as the paper reports it" + (" (not applied at this budget)." if budget else "."),
    ]
    with open(os.path.join(output, f"table{table_number}.md"), "w") as file:
        file.write("\n".join(lines) + "\n")
    with open(os.path.join(output, f"table{table_number}.csv"), "w", newline="") as file:
        writer = csv.DictWriter(file, list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    print("\n".join(lines))


def plot_curves(table, chosen, png_path):
    """Every variant's test error (solid) and training loss (dashed) of its first seed,
    one panel per network, as the paper's Fig. 3 and Fig. 6."""
    import matplotlib.pyplot as plt

    panels = []
    for cell in chosen:
        if (cell.dataset, cell.model) not in panels:
            panels.append((cell.dataset, cell.model))
    figure, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), dpi=110, squeeze=False)
    for axis, (dataset, model) in zip(axes[0], panels):
        loss_axis = axis.twinx()
        panel = {cell.row.label: cell for cell in chosen if (cell.dataset, cell.model) == (dataset, model)}
        for index, cell in enumerate(panel.values()):  # a network standing for several columns: once
            rows = plots.read_log(os.path.join(cell.run_dirs[0], "log.csv"))
            color = plt.cm.tab10(index % 10)
            loss_axis.plot(
                [int(row["step"]) for row in rows],
                [float(row["loss"]) for row in rows],
                "--",
                color=color,
                linewidth=0.8,
            )
            evaluated = [row for row in rows if row["test_error"]]
            axis.plot(
                [int(row["step"]) for row in evaluated],
                [100 * float(row["test_error"]) for row in evaluated],
                "-",
                color=color,
                linewidth=1.8,
                label=cell.row.label,
            )
        axis.axhline(FAIL_ERROR, color="grey", linewidth=0.6, linestyle=":")
        axis.set(xlabel="iterations", ylabel="test error (%), solid", title=f"{model} on {dataset}", ylim=(0, None))
        loss_axis.set(ylabel="training loss, dashed", ylim=(0, None))
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7, loc="lower left")
    figure.suptitle(table.title)
    figure.tight_layout()
    figure.savefig(png_path)
    plt.close(figure)
    return png_path
