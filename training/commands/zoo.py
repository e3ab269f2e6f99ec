"""`keras-preact zoo`: the model zoo's table, or Table 3's comparison at the zoo's scale."""

HELP = "print the model zoo's table: the shipped networks, their test error beside the published"
DESCRIPTION = (
    "Print, as Markdown, every network with shipped CIFAR-10 weights: unit, parameters, final "
    "test error on the 10,000 test images beside the paper's and two reimplementations' (the mean and "
    "standard deviation where the registry holds several seeds), training hours, recipe, file size and "
    "SHA-256 (from keras_preact/weights/registry.json)."
)
TENSORFLOW = "always"
BACKENDS = None


def add_arguments(parser):
    parser.add_argument(
        "--units",
        action="store_true",
        help="print instead the original against the pre-activation unit at each depth "
        "shipped with both under one recipe (Table 3 at the zoo's scale)",
    )


def run(arguments):
    from ..experiments import zoo_tables

    print(zoo_tables.unit_comparison_table() if arguments.units else zoo_tables.markdown_table())
    return 0
