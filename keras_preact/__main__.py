"""`python -m keras_preact`: the Markdown table of every network and its parameters."""

import numpy as np

from keras_preact import architectures, models


def parameter_counts(model):
    """(trainable parameters, of which not BatchNorm's gamma and beta)."""
    trainable = model.trainable_variables
    total = sum(int(np.prod(variable.shape)) for variable in trainable)
    # BatchNorm's are named bn1/gamma in a separate unit, bn1_gamma in a loop of units.
    batch_norm = sum(int(np.prod(v.shape)) for v in trainable if v.path.endswith(("gamma", "beta")))
    return total, total - batch_norm


def model_table():
    """The Markdown table of every architecture: its parameters with and without BatchNorm's."""
    rows = [
        "| model | unit | units per stage | depth | parameters | without BatchNorm | paper |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, architecture in architectures.ARCHITECTURES.items():
        # Units as loops: the same weights, built in seconds at any depth.
        total, without_batch_norm = parameter_counts(models.ResNet(name, scan_units=True))
        paper = f"{architecture.paper_parameters}M" if architecture.paper_parameters else ""
        rows.append(
            f"| `{name}` | {architecture.form} | {list(architecture.units_per_stage)} | {architecture.depth} "
            f"| {total / 1e6:.3f}M | {without_batch_norm / 1e6:.3f}M | {paper} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(model_table())
