"""`keras-preact zoo`: the model zoo's table, or Table 3's comparison at the zoo's scale."""

HELP = "print the model zoo's table: the shipped networks, their test error beside the published"
DESCRIPTION = (
    "Print, as a Markdown table that a terminal of 100 columns shows, every network with shipped CIFAR-10 (or "
    "--dataset cifar100) weights: unit, parameters, final test error on the 10,000 test images single crop and "
    "with the flip (the mean and standard deviation where the registry holds several seeds) beside the paper's, "
    "hours alone and data; --wide adds the reimplementations' errors, training-set error, recipe, file size and "
    "SHA-256, --csv gives every figure as CSV (from keras_preact/weights/registry.json)."
)
TENSORFLOW = "always"
BACKENDS = None


def add_arguments(parser):
    parser.add_argument(
        "--dataset",
        default="cifar10",
        choices=["cifar10", "cifar100"],
        help="the data set's networks (default: cifar10)",
    )
    form = parser.add_mutually_exclusive_group()
    form.add_argument(
        "--wide",
        action="store_true",
        help="every column (recipe, training-set error, file, ...), as docs/zoo.md has it",
    )
    form.add_argument("--csv", action="store_true", help="every figure as CSV, for a spreadsheet")
    parser.add_argument(
        "--units",
        action="store_true",
        help="print instead the original against the pre-activation unit at each depth "
        "shipped with both under one recipe (Table 3 at the zoo's scale)",
    )


def run(arguments):
    from ..experiments import zoo_tables

    if arguments.units:
        table = zoo_tables.unit_comparison_table
    else:
        table = (
            zoo_tables.csv_table
            if arguments.csv
            else zoo_tables.markdown_table
            if arguments.wide
            else zoo_tables.short_table
        )
    print(table(dataset=arguments.dataset))
    return 0
