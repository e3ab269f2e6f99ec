"""`keras-preact configs`: the named configs, or one with every field and its meaning."""

HELP = "list the configs (purpose, paper result, command, fields changed), or one in full"
DESCRIPTION = (
    "List every config: what it is for, the paper's result, the command that runs it, and the "
    "fields it changes from the defaults, one per line; with a NAME, that config's every field and what it "
    "means."
)
TENSORFLOW = "never"
BACKENDS = None


def add_arguments(parser):
    from ..train import named_configs

    parser.add_argument(
        "name",
        nargs="?",
        choices=sorted(named_configs.CONFIGS),
        metavar="NAME",
        help=f"one of {sorted(named_configs.CONFIGS)}: print every field of it",
    )


def run(arguments):
    from ..train import named_configs

    names = [arguments.name] if arguments.name else list(named_configs.CONFIGS)
    print("\n\n".join("\n".join(named_configs.describe(name, every_field=bool(arguments.name))) for name in names))
    return 0
