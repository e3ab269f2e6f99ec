"""`keras-preact diagnose`: how signals and gradients propagate through the units (Section 3,
Fig. 6 and 7 of the paper), as plots and tables."""

import os

HELP = "measure and plot how signals and gradients propagate through the units"
DESCRIPTION = (
    "Measure, at initialisation and on a batch of real images, the norms of every unit's "
    "output, residual and shortcut and of the gradient at its input, for the paper's comparisons "
    "(original vs pre-activation, plain vs residual, scaled and gated shortcuts); write plots and tables."
)
TENSORFLOW = "always"
BACKENDS = None


def add_arguments(parser):
    parser.add_argument(
        "--depths",
        type=int,
        nargs="+",
        default=[110, 164, 1001],
        help="CIFAR depths for original vs pre-activation (default: 110 164 1001)",
    )
    parser.add_argument(
        "--depth",
        type=int,
        default=110,
        help="depth of the plain, scaled and gated comparisons (default: 110, basic units)",
    )
    parser.add_argument("--batch-size", type=int, default=16, help="images in the batch (default: 16)")
    parser.add_argument("--data-dir", help="CIFAR-10 as an image folder; default: the embedded digits")
    parser.add_argument("--seed", type=int, default=0, help="seed of the networks' initialisation (default: 0)")
    parser.add_argument("--output", default=os.path.join("runs", "diagnose"), help="default: runs/diagnose")


def run(arguments):
    from ..experiments import diagnose

    diagnose.diagnose(
        arguments.output, arguments.depths, arguments.depth, arguments.batch_size, arguments.data_dir, arguments.seed
    )
    print(f"Plots and tables in {arguments.output}.")
    return 0
