"""`keras-preact diagnose`: the paper's propagation argument, measured and drawn.

Builds networks at initialisation, runs a batch of real images through them in
training mode, and writes to the output directory:

- gradients.png: ||dE/dx_l|| at every unit's input, for four comparisons: original
  against pre-activation units at each depth; plain against residual; shortcuts
  scaled by lambda = 0.5 and 0.9 against identity; gated shortcuts at b_g = 0 and -6;
- shortcut_gains.png: Eqn. 8's shortcut term, measured with the residual branches
  zeroed, next to its formula prod lambda_i;
- forward.png: ||x_l|| and ||F(x_l)|| / ||h(x_l)|| at every unit;
- propagation.md / propagation.csv: one row per network; identity.md: the identity check.
"""

import csv
import os

import matplotlib

matplotlib.use("Agg")
import keras
import matplotlib.pyplot as plt
import numpy as np

import keras_preact
from keras_preact import analysis, defaults

from .. import checked_files
from ..train import configs, named_configs

# The paper's shortcut variants (Table 1), on pre-activation units so that, as in the
# derivation of Eqns. 7-8, nothing follows the addition: only h differs.
SCALES = (0.5, 0.9)
GATE_BIASES = (0.0, -6.0)


def comparisons(depths, depth):
    """{panel: [(label, builder arguments)]}: the networks each panel compares."""
    name = f"resnet{depth}"
    # The same label means the same network, measured once and drawn in every panel.
    preactivation = (f"ResNet-{depth} pre-activation", dict(architecture=name))
    return {
        "original vs pre-activation": [
            (f"ResNet-{d} {label}", dict(architecture=f"resnet{d}", unit=unit))
            for d in depths
            for unit, label in (("original", "original"), ("preactivation", "pre-activation"))
        ],
        "plain vs residual": [
            (f"ResNet-{depth} plain", dict(architecture=name, unit="original", merge=keras_preact.NoShortcut())),
            (f"ResNet-{depth} original", dict(architecture=name, unit="original")),
            preactivation,
        ],
        "scaled shortcuts": [preactivation]
        + [
            (f"ResNet-{depth} lambda={scale}", dict(architecture=name, merge=keras_preact.ConstantScaling(scale, 1.0)))
            for scale in SCALES
        ],
        "gated shortcuts": [preactivation]
        + [
            (f"ResNet-{depth} {gate.__name__} b_g={bias:g}", dict(architecture=name, merge=gate(bias)))
            for gate in (keras_preact.ExclusiveGating, keras_preact.ShortcutOnlyGating)
            for bias in GATE_BIASES
        ],
    }


def real_images(count, data_dir=None):
    """`count` real images as CIFAR networks take them (32x32x3, standardised) and labels:
    CIFAR-10 test images from an image folder, or else the embedded digits scaled up."""
    if data_dir:
        from ..data import datasets

        config = named_configs.CONFIGS["cifar10_paper"].override("dataset=folder", f"data_dir={data_dir}")
        images, labels = next(
            iter(datasets.input_pipeline(config).evaluation_arrays(datasets.load(config, splits=("test",)).test, 10000))
        )
        order = np.random.default_rng(0).permutation(len(labels))[:count]
        images, labels = images[order], labels[order]
    else:
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = np.repeat(np.kron(digits.images[:count], np.ones((4, 4)))[..., None], 3, axis=-1)
        labels = digits.target[:count]
    images = (images - images.mean(axis=(0, 1, 2))) / images.std(axis=(0, 1, 2))
    return images.astype("float32"), labels


def diagnose(output, depths=(110, 164, 1001), depth=110, batch_size=16, data_dir=None, seed=0, verbose=True):
    """Measures every comparison and writes the plots and tables to `output`; returns the rows.

    Raises:
        ValueError: for a batch size that is not a positive integer or a seed outside
            0..2**32 - 1 (both before anything is measured or written), or an output folder
            that cannot be made.
    """
    if not defaults.is_integer(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer. Received: batch_size={batch_size!r}")
    configs.check_seed(seed)
    keras.utils.set_random_seed(seed)
    checked_files.make_directory(output, "output folder")
    images, labels = real_images(batch_size, data_dir)
    measured, rows = {}, []
    for networks in comparisons(depths, depth).values():
        for label, arguments in networks:
            if label not in measured:
                model = keras_preact.ResNet(**arguments)
                measured[label] = analysis.propagation(model, images, labels)
                rows.append(summary_row(label, measured[label]))
                if verbose:
                    print(f"{label}: gradient ratio first/last unit {rows[-1]['gradient_ratio']:.3g}")
    write_tables(rows, output)
    plot_gradients(comparisons(depths, depth), measured, os.path.join(output, "gradients.png"))
    plot_forward(
        comparisons(depths, depth)["original vs pre-activation"], measured, os.path.join(output, "forward.png")
    )
    gains = measure_gains(depth, images)
    plot_gains(gains, os.path.join(output, "shortcut_gains.png"))
    write_identity_checks(depth, os.path.join(output, "identity.md"))
    return rows


def summary_row(label, statistics):
    gradients = [unit.input_gradient_norm for unit in statistics]
    ratio = gradients[0] / gradients[-1]
    return dict(
        network=label,
        units=len(statistics),
        gradient_ratio=ratio,
        gradient_factor_per_unit=ratio ** (1 / (len(statistics) - 1)),
        mean_residual_to_shortcut=float(np.mean([unit.residual_to_shortcut for unit in statistics])),
        last_output_norm=statistics[-1].output_norm,
    )


def write_tables(rows, output):
    with open(os.path.join(output, "propagation.csv"), "w", newline="") as file:
        writer = csv.DictWriter(file, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        "| network | units | gradient first / last unit | per unit | mean ||F|| / ||h|| | last ||x|| |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {row['network']} | {row['units']} | {row['gradient_ratio']:.3g} | {row['gradient_factor_per_unit']:.3f} "
        f"| {row['mean_residual_to_shortcut']:.2f} | {row['last_output_norm']:.1f} |"
        for row in rows
    ]
    with open(os.path.join(output, "propagation.md"), "w") as file:
        file.write("\n".join(lines) + "\n")


def plot_gradients(panels, measured, path):
    figure, axes = plt.subplots(2, 2, figsize=(12, 8), dpi=110)
    for axis, (panel, networks) in zip(axes.flat, panels.items()):
        for label, _ in networks:
            axis.semilogy([unit.input_gradient_norm for unit in measured[label]], label=label, linewidth=1.2)
        axis.set_title(panel)
        axis.set_xlabel("unit l (input to output)")
        axis.set_ylabel("||dE/dx_l||")
        axis.grid(alpha=0.3, which="both")
        axis.legend(fontsize=7)
    figure.suptitle("Gradient at each unit's input, at initialisation (training mode)")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def plot_forward(networks, measured, path):
    figure, (norms, ratios) = plt.subplots(1, 2, figsize=(12, 4.5), dpi=110)
    for label, _ in networks:
        norms.plot([unit.output_norm for unit in measured[label]], label=label, linewidth=1.2)
        ratios.semilogy([unit.residual_to_shortcut for unit in measured[label]], label=label, linewidth=1.2)
    norms.set(title="||x_(l+1)||, each unit's output", xlabel="unit l", ylabel="norm")
    ratios.set(title="||F(x_l)|| / ||h(x_l)||", xlabel="unit l", ylabel="ratio")
    for axis in (norms, ratios):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def measure_gains(depth, images):
    """Shortcut gains through stage 1 of ResNet-`depth` with F = 0, for each variant."""
    variants = {
        "identity": None,
        **{f"lambda={scale}": keras_preact.ConstantScaling(scale, 1.0) for scale in SCALES},
        **{f"ShortcutOnlyGating b_g={bias:g}": keras_preact.ShortcutOnlyGating(bias) for bias in GATE_BIASES},
    }
    gains = {}
    for label, merge in variants.items():
        model = keras_preact.ResNet(f"resnet{depth}", merge=merge)
        units = analysis.stage_units(model, 1)
        stem = stem_of(model)
        gains[label] = analysis.shortcut_gains(units, stem(images))
    return gains


def stem_of(model):
    """The network up to its first unit, as a model of the images."""
    return keras.Model(model.input, analysis.residual_units(model)[0].input)


def plot_gains(gains, path):
    figure, axis = plt.subplots(figsize=(7, 4.5), dpi=110)
    for label, values in gains.items():
        (line,) = axis.semilogy(range(len(values)), values, "o", markersize=4, label=f"{label} (measured)")
        if label.startswith("lambda="):
            scale = float(label.split("=")[1])
            last = len(values) - 1
            axis.semilogy(
                range(len(values)),
                [scale ** (last - index) for index in range(len(values))],
                "--",
                color=line.get_color(),
                linewidth=1,
                label=f"{label}: lambda^(L-l)",
            )
    axis.set(
        title="Eqn. 8's shortcut term: ||dE/dx_l|| / ||dE/dx_L|| with F = 0 (stage 1)", xlabel="unit l", ylabel="gain"
    )
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def write_identity_checks(depth, path):
    lines = ["| units | stage-1 units | max |x_L - x_l| | max |dx_L/dx_l - I| | identity |", "|---|---|---|---|---|"]
    # Eqns. 4-5 hold for any x_l: a random one, 8x8 so that the Jacobian is 1024 x 1024.
    x_l = np.random.default_rng(0).normal(size=(1, 8, 8, 16)).astype("float32")
    for unit in ("preactivation", "original"):
        check = analysis.identity_mapping(
            analysis.stage_units(keras_preact.ResNet(f"resnet{depth}", unit=unit), 1), x_l
        )
        lines.append(
            f"| {unit} | {check.units} | {check.output_error:.3g} | {check.jacobian_error:.3g} | "
            f"{'exact' if check.passed else 'no'} |"
        )
    with open(path, "w") as file:
        file.write("\n".join(lines) + "\n")
