"""Lands a finished zoo run: the network, its registry entry, curves, logs and table rows together.

    python -m scripts.land_zoo_run ~/.cache/keras-preact/runs/zoo-resnet20 --name resnet20 --images-per-second 690
    python -m scripts.land_zoo_run ~/.cache/keras-preact/runs/zoo-resnet20-seed1 --name resnet20 \
        --images-per-second 690 --another-seed

Publishes the run (`keras-preact publish`: the weights file, its trained weights or with
`--weights average` or `swa` the average of the weights it kept, evaluated again, and its registry entry with
the hours alone at the rate measured alone), draws its curves from its log into
`docs/zoo_<name>_curves.png` (a CIFAR-100 run's `docs/zoo_cifar100_<name>_curves.png`; titled
with the data folder's name, whichever code version trained it), copies its config, log and
summary to `docs/runs/zoo-<name>/` (`zoo-cifar100-<name>/`), and rewrites from the registry the
zoo's tables in README.md (CIFAR-10's short one and its units, `keras-preact zoo` and `zoo --units`)
and docs/zoo.md (every data set's: `zoo --wide` and `zoo --units`) and docs/zoo.md's curves, one figure per network in the table's order. With `--another-seed`, the run is the shipped network's recipe trained
again with another seed: its errors join the network's entry (`zoo.add_seed`; the shipped
weights and curves stay the first seed's), its logs go to `docs/runs/zoo-<name>-seed<seed>/`,
and the tables give the mean and standard deviation over the seeds. The run's checkpoint carried
between machines (scripts/carried/<run>.tar, scripts/carry_runs.py) is deleted. Then commit the
lot in one commit, with the run's line of scripts/queue.txt removed.
"""

import argparse
import json
import os
import shutil
import types

from keras_preact_training import plots
from keras_preact_training.data import datasets
from keras_preact_training.experiments import zoo, zoo_tables
from keras_preact_training.train import configs
from scripts import carry_runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def replace_block(text, block, start, what):
    """`text` with the paragraph that begins with `start` (up to the next blank line) replaced by `block`."""
    if start not in text:
        raise ValueError(f"no {what} {start!r} to replace")
    begin = text.index(start)
    end = text.find("\n\n", begin)
    end = len(text) if end == -1 else end
    return text[:begin] + block + text[end:]


def replace_table(text, table):
    """`text` with the Markdown table whose header line is `table`'s first replaced by `table`."""
    return replace_block(text, table, table.splitlines()[0], "table with the header")


def replace_curve_images(text, images, dataset="cifar10"):
    """`text` with its paragraph of the zoo's curve images of `dataset` replaced by `images`."""
    return replace_block(text, images, zoo_tables.curve_images_start(dataset), "paragraph of images beginning")


def draw_curves(run_dir, name, png_path):
    """The run's test error and training loss (its log.csv) drawn into `png_path`, titled
    with the network's name and its data's (an image folder by its own name)."""
    with open(os.path.join(run_dir, "config.json")) as file:
        config = types.SimpleNamespace(**json.load(file))
    return plots.training_curves(
        os.path.join(run_dir, "log.csv"),
        png_path,
        title=f"{name} on {datasets.name(config)}",
        averages=configs.AVERAGE_NAMES,
    )


# The tables of each data set on the zoo page.
TABLES = (zoo_tables.markdown_table, zoo_tables.unit_comparison_table)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--name", required=True, help="the network, e.g. resnet20 or resnet56_original")
    parser.add_argument(
        "--images-per-second",
        type=float,
        required=True,
        help="its training rate measured alone (bench/training_throughput.py --config cifar10_zoo)",
    )
    parser.add_argument("--data-dir", help="CIFAR-10 here, where the run trained elsewhere (default: the run's own)")
    parser.add_argument(
        "--weights",
        default="final",
        choices=["final", "average", "swa"],
        help="ship the run's trained weights (default) or the average of them it kept (moving or equal), "
        "as validation chose",
    )
    parser.add_argument(
        "--another-seed",
        action="store_true",
        help="the run is the shipped network's recipe with another seed: add its errors to the network's entry",
    )
    arguments = parser.parse_args()
    # CIFAR-10's files keep their names; another data set's carry its name.
    _, dataset = zoo.finished_run(arguments.run_dir)
    prefix = "" if dataset == "cifar10" else f"{dataset}-"
    if arguments.another_seed:
        entry = zoo.add_seed(
            arguments.run_dir, arguments.name, arguments.data_dir, images_per_second=arguments.images_per_second
        )
        landed = entry["other_seeds"][-1]
        logs = os.path.join(ROOT, "docs", "runs", f"zoo-{prefix}{arguments.name}-seed{landed['seed']}")
    else:
        landed = entry = zoo.publish(
            arguments.run_dir,
            arguments.name,
            arguments.data_dir,
            images_per_second=arguments.images_per_second,
            weights=arguments.weights,
        )
        draw_curves(
            arguments.run_dir,
            arguments.name,
            os.path.join(ROOT, "docs", zoo_tables.curve_file(arguments.name, dataset)),
        )
        logs = os.path.join(ROOT, "docs", "runs", f"zoo-{prefix}{arguments.name}")
    os.makedirs(logs, exist_ok=True)
    for name in ("config.json", "log.csv", "summary.json"):
        shutil.copy(os.path.join(arguments.run_dir, name), logs)
    carry_runs.forget(arguments.run_dir)
    # The README shows CIFAR-10's tables; the zoo page every data set's.
    tables = {
        "README.md": [zoo_tables.short_table(), zoo_tables.unit_comparison_table()],
        "docs/zoo.md": [table(dataset=name) for name in zoo.DATA_DESCRIPTIONS for table in TABLES],
    }
    for document, replacements in tables.items():
        path = os.path.join(ROOT, document)
        with open(path) as file:
            text = file.read()
        for table in replacements:
            text = replace_table(text, table)
        if document == "docs/zoo.md":
            for name in zoo.DATA_DESCRIPTIONS:
                text = replace_curve_images(text, zoo_tables.curve_images(dataset=name), name)
        with open(path, "w") as file:
            file.write(text)
    seeds = len(zoo_tables.seed_values(entry, "test_error"))
    over_seeds = f" ({seeds} seeds: {zoo_tables.percent(entry, 'test_error')} %)" if seeds > 1 else ""
    print(
        f"{arguments.name}: test error {100 * landed['test_error']:.2f} %, with flip "
        f"{100 * landed['flip_test_error']:.2f} %, {landed['hours_alone']:.2f} hours alone{over_seeds}; "
        f"logs and tables written: commit them together."
    )


if __name__ == "__main__":
    main()
