"""What the JPEG copy of CIFAR-10 cost: one recipe trained on each copy, each network tested on both.

    python -m scripts.jpeg_cost \
        --runs ~/.cache/keras-preact/runs/zoo-resnet20 ~/.cache/keras-preact/runs/jpeg-resnet20 \
        --data-dirs ~/.cache/keras-preact/cifar10-png ~/.cache/keras-preact/cifar10-jpeg

Prints docs/zoo.md's 2 x 2 table: a row per run (the copy it trained on), a column per test
set, each cell the final network's error single crop / with the test-time flip, in float32 as
`weights="cifar10"` loads a network (`keras-preact evaluate`'s measurement). The runs must train
the same network by the same recipe; each data folder is named in the table by its own name.

The JPEG copy of CIFAR-10 has since left ../shared/data, so this measurement cannot be made again
here as it was; its recorded results stay in docs/zoo.md ("What the JPEG copy cost") and
docs/runs/jpeg-cost-2026-11-28/, and the script still compares any two runs of one recipe on two
copies of a data set.
"""

import argparse
import json
import os
import tempfile

from keras_preact_training.data import datasets
from keras_preact_training.experiments import zoo
from keras_preact_training.train import evaluate


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs=2, required=True, help="two finished runs of one recipe on the two copies")
    parser.add_argument("--data-dirs", nargs=2, required=True, help="the two copies as image folders")
    arguments = parser.parse_args()
    configs = []
    for run in arguments.runs:
        with open(os.path.join(run, "config.json")) as file:
            configs.append(json.load(file))
    differing = sorted(
        field for field in configs[0] if field != "data_dir" and configs[0][field] != configs[1].get(field)
    )
    if differing:
        raise SystemExit(f"error: the runs differ by more than their data: {differing}. Received: {arguments.runs}")
    names = [datasets.folder_name(folder) for folder in arguments.data_dirs]
    lines = [
        "| trained on | " + " | ".join(f"tested on {name} %" for name in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for run, config in zip(arguments.runs, configs, strict=True):
        with tempfile.TemporaryDirectory() as folder:
            path, _ = zoo.save_network(run, config["model"], folder)
            cells = []
            for data_dir in arguments.data_dirs:
                result = evaluate.evaluate(config["model"], path, data_dir=data_dir, flip=True)
                cells.append(f"{100 * result['error']:.2f} / {100 * result['flip_error']:.2f}")
        lines.append(f"| {datasets.folder_name(config['data_dir'])} | " + " | ".join(cells) + " |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
