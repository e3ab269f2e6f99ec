"""`python -m keras_preact`: the model table, or build, run, save and reload one network.

    python -m keras_preact models              # Markdown table of every network
    python -m keras_preact demo --model resnet164 --output saved_models/resnet164.keras
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_preact import architectures, models  # noqa: E402


def parameter_counts(model):
    """(trainable parameters, of which in convolutions and the classifier)."""
    trainable = [variable for variable in model.trainable_variables]
    total = sum(int(np.prod(variable.shape)) for variable in trainable)
    batch_norm = sum(int(np.prod(v.shape)) for v in trainable if v.path.rsplit("/", 1)[-1] in ("gamma", "beta"))
    return total, total - batch_norm


def model_table():
    rows = [
        "| model | unit | units per stage | depth | parameters | without BatchNorm | paper |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, architecture in architectures.ARCHITECTURES.items():
        total, without_batch_norm = parameter_counts(models.ResNet(name))
        paper = f"{architecture.paper_parameters}M" if architecture.paper_parameters else ""
        rows.append(
            f"| `{name}` | {architecture.form} | {list(architecture.units_per_stage)} | {architecture.depth} "
            f"| {total / 1e6:.3f}M | {without_batch_norm / 1e6:.3f}M | {paper} |"
        )
    return "\n".join(rows)


def demo(model_name, output):
    started = time.perf_counter()
    model = models.get_model(model_name)
    built = time.perf_counter() - started
    total, _ = parameter_counts(model)
    print(f"Built {model.name}: {len(model.layers)} layers, {total:,} trainable parameters, in {built:.1f} s.")
    images = np.random.default_rng(0).uniform(0, 1, (8,) + tuple(model.input_shape[1:])).astype("float32")
    probabilities = np.array(model(images, training=False))
    print(f"Ran a batch of {len(images)} images: output {probabilities.shape}, rows sum to "
          f"{probabilities.sum(axis=1).round(4).tolist()}.")
    os.makedirs(os.path.dirname(output) or ".", exist_ok=True)
    model.save(output)
    restored = keras.saving.load_model(output)
    same = np.array_equal(np.array(restored(images, training=False)), probabilities)
    print(f"Saved to {output} and reloaded: {'identical' if same else 'DIFFERENT'} outputs.")
    return 0 if same else 1


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m keras_preact", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("models", help="print the Markdown table of every network and its parameters")
    run = commands.add_parser("demo", help="build a network, run it on a batch, save it and reload it")
    run.add_argument("--model", default="resnet164", choices=models.list_models(), metavar="NAME",
                     help="a registered model (default: resnet164); `python -m keras_preact models` lists them")
    run.add_argument("--output", default=os.path.join("saved_models", "demo", "model.keras"),
                     help="where to save the .keras file (default: saved_models/demo/model.keras)")
    arguments = parser.parse_args(argv)
    if arguments.command == "models":
        print(model_table())
        return 0
    return demo(arguments.model, arguments.output)


if __name__ == "__main__":
    sys.exit(main())
