"""The model zoo's tables, from the registry (`keras_preact/weights/registry.json`), one per data
set (CIFAR-10, CIFAR-100): every shipped network beside the published errors (`keras-preact
zoo`), Table 3's comparison at the zoo's scale (`keras-preact zoo --units`), and the zoo page's
figures."""

import dataclasses
import json
import shlex
import statistics

from keras_preact import pretrained

from ..train import configs, named_configs
from .ablation import TABLES
from .zoo import recipe_differences, same_recipe, user_command

# Published test errors (%) of each depth of the zoo, by data set, for its tables: the paper's,
# by unit, as (error, source): He et al. 2015 ("Deep Residual Learning for Image Recognition",
# the paper's [1]), Table 6 (CIFAR-10, original units, 64k iterations), and this paper's Table 3
# (ResNet-110 and ResNet-164 with either unit on CIFAR-10, ResNet-164 on CIFAR-100, median of 5;
# its home is `ablation.TABLES`); and two public reimplementations' best test epoch of 200 epochs
# (slightly optimistic), akamaster/pytorch_resnet_cifar10 (original units, CIFAR-10 only) and
# chenyaofo/pytorch-cifar-models (cosine, weight decay 5e-4). The pre-activation ResNet-20 and
# -56 have no published row: the original networks' are their targets.
TABLE_3 = {unit: row.paper for unit, row in zip(("original", "preactivation"), TABLES[3].rows)}
REFERENCES = {
    "cifar10": {
        "resnet20": dict(original=(8.75, "He 2015"), akamaster=8.27, chenyaofo=7.40),
        "resnet56": dict(original=(6.97, "He 2015"), akamaster=6.61, chenyaofo=5.63),
        "resnet110": dict(
            **{unit: (TABLE_3[unit][("cifar10", "resnet110")], "Table 3") for unit in TABLE_3}, akamaster=6.32
        ),
        "resnet164": {unit: (TABLE_3[unit][("cifar10", "resnet164")], "Table 3") for unit in TABLE_3},
    },
    "cifar100": {
        "resnet20": dict(chenyaofo=31.5),
        "resnet56": dict(chenyaofo=27.6),
        "resnet164": {unit: (TABLE_3[unit][("cifar100", "resnet164")], "Table 3") for unit in TABLE_3},
    },
}
# Each data set's name in the tables' first header cell (which tells the tables apart on a page)
# and in the zoo page's figures.
DATASET_NAMES = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100"}
UNIT_NAMES = {"original": "original", "preactivation": "pre-activation"}


def depth_and_unit(name):
    """ "resnet56_original" -> ("resnet56", "original"); "resnet56" -> ("resnet56", "preactivation")."""
    if name.endswith("_original"):
        return name[: -len("_original")], "original"
    return name, "preactivation"


def paper_error(name, own_unit_only=False, dataset="cifar10"):
    """The paper's error of the zoo network `name` as the tables print it: "6.37 (Table 3)" for
    its own unit's row, else the other unit's, "8.75 (He 2015, original)" (or "none" with
    `own_unit_only`); "" for a depth the paper does not report."""
    depth, unit = depth_and_unit(name)
    published = REFERENCES[dataset].get(depth, {})
    if unit in published:
        return f"{published[unit][0]:.2f} ({published[unit][1]})"
    other = "original" if unit == "preactivation" else "preactivation"
    if other in published:
        return "none" if own_unit_only else f"{published[other][0]:.2f} ({published[other][1]}, {UNIT_NAMES[other]})"
    return ""


def in_table_order(registry=None, dataset="cifar10"):
    """The networks shipped for `dataset` as (name, registry entry) pairs in the zoo table's
    order: by size, then name (the pre-activation network before its original)."""
    entries = (registry or pretrained.registry()).get(dataset, {})
    return sorted(entries.items(), key=lambda item: (item[1]["parameters"], item[0]))


def trained_on(entry):
    """What a registry entry's network trained on, as the zoo's table says it: the original
    images, or the JPEG copy with its errors on that copy's test images (single crop / with flip)."""
    if entry.get("jpeg_test_error") is None:
        return data_name(entry)
    jpeg_errors = f"{100 * entry['jpeg_test_error']:.2f} / {100 * entry['jpeg_flip_test_error']:.2f}"
    return f"{data_name(entry)} (its test JPEGs: {jpeg_errors})"


def data_name(entry):
    """What a registry entry's network trained on, in two words: "original images" or "JPEG copy"."""
    return "original images" if entry.get("jpeg_test_error") is None else "JPEG copy"


def setting_text(value):
    """A config value as `--set FIELD=VALUE` takes it (`configs.parse_value`)."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return ",".join(f"{part:g}" if isinstance(part, float) else str(part) for part in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def seed_values(entry, key):
    """`key` ("test_error", "flip_test_error", "train_error") of each seed a registry entry
    holds: its own run's, then its other seeds' (`zoo.add_seed`); None where one lacks it."""
    return [entry.get(key), *(other.get(key) for other in entry.get("other_seeds", ()))]


def percent(entry, key):
    """`key` of a registry entry in percent as the tables print it: "9.06" for one seed, the
    mean and sample standard deviation "9.10 ± 0.06" over several; "" where a seed lacks it."""
    values = seed_values(entry, key)
    if None in values:
        return ""
    if len(values) == 1:
        return f"{100 * values[0]:.2f}"
    return f"{100 * statistics.mean(values):.2f} ± {100 * statistics.stdev(values):.2f}"


def test_error_cell(entry):
    """The zoo table's test error: the shipped file's, bold; over several seeds their mean and
    standard deviation, bold, and the shipped file's beside it; the trained weights' beside a
    shipped average of the weights."""
    seeds = len(seed_values(entry, "test_error"))
    shipped = "" if seeds == 1 else f" ({seeds} seeds; this file {100 * entry['test_error']:.2f})"
    if entry.get("weights") in configs.AVERAGE_NAMES:
        shipped += f" ({configs.AVERAGE_NAMES[entry['weights']]}; trained weights {100 * entry['final_weights']['test_error']:.2f})"
    return f"**{percent(entry, 'test_error')}**{shipped}"


def reproducing_command(entry):
    """The entry's command as a user types it (without the data folder), with `--set
    FIELD=VALUE` for each recipe field in which its run differs from the named config as that
    config is now: a run trained before the zoo's recipe changed is trained again by it. A
    field the run's config predates had `Config`'s default, one `Config` no longer has is
    left out; `precision=auto` (resolved per processor) is not a difference."""
    command = user_command(entry["command"], data_dir=False)
    words = shlex.split(command)
    named = named_configs.CONFIGS.get(words[words.index("--config") + 1]) if "--config" in words else None
    if named is None:
        return command
    already = {words[index + 1].partition("=")[0] for index, word in enumerate(words[:-1]) if word == "--set"}
    ran = json.loads(json.dumps({**configs.field_defaults(), **entry["config"]}))
    today = dataclasses.asdict(named)
    differing = [
        field
        for field in recipe_differences(ran, today, apart_from=already)
        if field in today and not (field == "precision" and named.precision == "auto")
    ]
    return shlex.join(
        [*words, *(part for field in differing for part in ("--set", f"{field}={setting_text(ran[field])}"))]
    )


def header_cell(dataset):
    """A table's first header cell: "network" for CIFAR-10's (the zoo's first), "CIFAR-100 network" for another's."""
    return "network" if dataset == "cifar10" else f"{DATASET_NAMES[dataset]} network"


def markdown_table(registry=None, dataset="cifar10"):
    """The zoo's table of `dataset`: every network shipped for it, its final error on the 10,000
    original test images beside the published ones, what it trained on, its training hours and
    recipe, its file; a row that says so where none is shipped yet."""
    lines = [
        f"| {header_cell(dataset)} | unit | parameters | test error % | with flip % | training-set error % | "
        "trained on | paper % | akamaster % | chenyaofo % | hours | hours alone (images/s) | recipe | file | sha256 |",
        "|---" * 15 + "|",
    ]
    shipped = in_table_order(registry, dataset)
    if not shipped:
        lines.append("| none yet: see the training queue in docs/zoo.md |" + " |" * 14)
    for name, entry in shipped:
        references = REFERENCES[dataset].get(depth_and_unit(name)[0], {})
        config = entry["config"]
        command = f"`{reproducing_command(entry)}`" if entry.get("command") else ""
        alone = (
            f"{entry['hours_alone']:.2f} ({entry['images_per_second_alone']:g})"
            if entry.get("hours_alone") is not None
            else ""
        )
        lines.append(
            f"| {name} | {UNIT_NAMES[depth_and_unit(name)[1]]} | "
            f"{entry['parameters'] / 1e6:.2f}M | {test_error_cell(entry)} | {percent(entry, 'flip_test_error')} | "
            f"{percent(entry, 'train_error')} | "
            f"{trained_on(entry)} | "
            f"{paper_error(name, dataset=dataset)} | "
            f"{references.get('akamaster') or ''} | {references.get('chenyaofo') or ''} | "
            f"{entry['training_hours']:.1f} | {alone} | {command} ({config['duration']:g} {config['schedule_unit']}, "
            f"{config.get('schedule', 'step')}, {config.get('precision', 'float32')}) | {entry['bytes'] / 2**20:.1f} MB | "
            f"`{entry['sha256'][:12]}` |"
        )
    return "\n".join(lines)


# The short table's columns (`short_table`): a terminal of 100 columns shows it whole.
SHORT_WIDTH = 100


def short_table(registry=None, dataset="cifar10"):
    """The zoo's table of `dataset` in at most `SHORT_WIDTH` columns a line, as `keras-preact zoo`
    prints it and the README shows it: each network's test error single crop and with the flip
    beside the paper's, its hours alone and its data (the original images or the JPEG copy);
    `markdown_table` has every column."""
    lines = [
        f"| {header_cell(dataset)} | unit | parameters | test error % | with flip % | paper % | hours alone | data |",
        "|---|---|---|---|---|---|---|---|",
    ]
    shipped = in_table_order(registry, dataset)
    if not shipped:
        lines.append("| none yet | | | | | | | |")
    for name, entry in shipped:
        seeds = len(seed_values(entry, "test_error"))
        error = percent(entry, "test_error") + (f" ({seeds} seeds)" if seeds > 1 else "")
        alone = f"{entry['hours_alone']:.2f}" if entry.get("hours_alone") is not None else ""
        paper = paper_error(name, dataset=dataset).replace(", original", ", orig.")
        lines.append(
            f"| {name} | {UNIT_NAMES[depth_and_unit(name)[1]]} | {entry['parameters'] / 1e6:.2f}M | {error} | "
            f"{percent(entry, 'flip_test_error')} | {paper} | {alone} | {data_name(entry).removesuffix(' images')} |"
        )
    return "\n".join(lines)


def csv_table(registry=None, dataset="cifar10"):
    """Every registry figure of `dataset`'s networks as CSV, a row a network, for a spreadsheet."""
    import csv
    import io

    fields = [
        "network",
        "unit",
        "parameters",
        "test_error",
        "flip_test_error",
        "train_error",
        "paper",
        "training_hours",
        "hours_alone",
        "images_per_second_alone",
        "weights",
        "command",
        "file",
        "sha256",
    ]
    text = io.StringIO()
    writer = csv.DictWriter(text, fields, lineterminator="\n")
    writer.writeheader()
    for name, entry in in_table_order(registry, dataset):
        writer.writerow(
            dict(
                {field: entry.get(field) for field in fields},
                network=name,
                unit=UNIT_NAMES[depth_and_unit(name)[1]],
                paper=paper_error(name, dataset=dataset),
                weights=entry.get("weights", "final"),
                command=entry.get("command") and reproducing_command(entry),
            )
        )
    return text.getvalue().rstrip("\n")


# How each of the zoo page's curve images begins (its alt text's start), which the landing script finds them by.
CURVE_IMAGE_START = "![Test error and training loss of the zoo's"
# Where the paragraph of another data set's figures begins (a comment, so that the paragraph is
# there before its first figure).
CURVE_MARK = "<!-- The zoo's {name} curves, one per shipped network -->"


def curve_file(name, dataset="cifar10"):
    """The file of a network's curves beside the zoo page: `zoo_<name>_curves.png` for CIFAR-10,
    `zoo_<dataset>_<name>_curves.png` for another data set."""
    return f"zoo_{name}_curves.png" if dataset == "cifar10" else f"zoo_{dataset}_{name}_curves.png"


def curve_images_start(dataset="cifar10"):
    """How the paragraph of `dataset`'s figures begins on the zoo page."""
    return CURVE_IMAGE_START if dataset == "cifar10" else CURVE_MARK.format(name=DATASET_NAMES[dataset])


def curve_images(registry=None, dataset="cifar10"):
    """The zoo page's figures of `dataset`, one per shipped network in the table's order: the
    curves (`curve_file`) that scripts/land_zoo_run.py draws from its run's log; another data
    set's paragraph begins with its mark (`curve_images_start`)."""
    images = [] if dataset == "cifar10" else [curve_images_start(dataset)]
    for name, _ in in_table_order(registry, dataset):
        depth, unit = depth_and_unit(name)
        data = "" if dataset == "cifar10" else f" {DATASET_NAMES[dataset]}"
        images.append(
            f"{CURVE_IMAGE_START}{data} {UNIT_NAMES[unit]} ResNet-{depth.removeprefix('resnet')}]"
            f"({curve_file(name, dataset)})"
        )
    return "\n".join(images)


def unit_comparison_table(registry=None, dataset="cifar10"):
    """Table 3 at the zoo's scale: each depth the zoo ships with both units trained by the same
    recipe, the original and the pre-activation network's final test errors (single crop and
    with the flip; the mean and standard deviation where an entry holds several seeds), the
    pre-activation unit's gain (of the means) and the seeds each holds, beside the paper's (a
    row that says so where there is no such depth)."""
    entries = (registry or pretrained.registry()).get(dataset, {})
    lines = [
        f"| {header_cell(dataset)} | original % | pre-activation % | gain (points) | with flip: original / "
        "pre-activation % "
        "| seeds: original / pre-activation | paper: original / pre-activation % | recipe; trained on |",
        "|---|---|---|---|---|---|---|---|",
    ]
    pairs = [
        (name, entries[name], entries[f"{name}_original"])
        for name in entries
        if f"{name}_original" in entries and same_recipe(entries[name], entries[f"{name}_original"])
    ]
    for name, preactivation, original in sorted(pairs, key=lambda pair: pair[1]["parameters"]):
        config = preactivation["config"]
        flips = (
            f"{percent(original, 'flip_test_error')} / {percent(preactivation, 'flip_test_error')}"
            if percent(original, "flip_test_error") and percent(preactivation, "flip_test_error")
            else ""
        )
        gain = 100 * (
            statistics.mean(seed_values(original, "test_error"))
            - statistics.mean(seed_values(preactivation, "test_error"))
        )
        seeds = f"{len(seed_values(original, 'test_error'))} / {len(seed_values(preactivation, 'test_error'))}"
        lines.append(
            f"| {name} | {percent(original, 'test_error')} | {percent(preactivation, 'test_error')} | {gain:+.2f} | "
            f"{flips} | {seeds} | {paper_error(f'{name}_original', True, dataset)} / "
            f"{paper_error(name, True, dataset)} | "
            f"{config['duration']:g} {config['schedule_unit']}, {config.get('schedule', 'step')}; "
            f"{data_name(preactivation)} |"
        )
    if not pairs:
        lines.append("| none yet: no depth is shipped with both units trained by one recipe | | | | | | | |")
    return "\n".join(lines)
