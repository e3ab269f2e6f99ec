"""`python -m keras_preact`: the Markdown table of every network and its parameters."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from keras_preact import architectures, models  # noqa: E402


def parameter_counts(model):
    """(trainable parameters, of which not BatchNorm's gamma and beta)."""
    trainable = model.trainable_variables
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


if __name__ == "__main__":
    print(model_table())
