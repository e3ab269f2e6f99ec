"""`keras-preact publish`: a finished CIFAR-10 or CIFAR-100 run's network into the model zoo."""

HELP = "put a finished CIFAR-10 or CIFAR-100 run's network into the model zoo (keras_preact/weights)"
DESCRIPTION = (
    "Save the network of a finished CIFAR-10 or CIFAR-100 run as keras_preact/weights/<cifar10 or "
    "cifar100>_<name>.weights.h5 and register it (SHA-256, test error of the saved file, the run's config, "
    "command and hours), so that keras_preact.get_model(name, weights='cifar10') (or 'cifar100') loads it."
)
TENSORFLOW = "always"
BACKENDS = None


def add_arguments(parser):
    parser.add_argument("--run-dir", required=True, help="a finished run of `keras-preact train`")
    parser.add_argument("--name", required=True, help="the network's name, e.g. resnet20 or resnet20_original")
    parser.add_argument("--data-dir", help="the run's data, to evaluate the saved file (default: the run's)")
    parser.add_argument(
        "--images-per-second",
        type=float,
        help="the network's training rate measured alone on the machine that trained it "
        "(python bench/training_throughput.py): the entry records the hours alone",
    )
    parser.add_argument(
        "--weights",
        default="final",
        choices=["final", "average", "swa"],
        help="the run's trained weights (default), the weights' moving average it kept (--set average_momentum=...) "
        "or their equal average (--set swa_start=...); "
        "the entry keeps the trained weights' errors too",
    )
    parser.add_argument(
        "--another-seed",
        action="store_true",
        help="the run is the registered network's recipe trained with another seed: its errors join the "
        "network's entry (the tables give the mean and standard deviation over the seeds); its weights are not shipped",
    )


def run(arguments):
    from ..experiments import zoo, zoo_tables

    if arguments.another_seed:
        entry = zoo.add_seed(
            arguments.run_dir, arguments.name, arguments.data_dir, images_per_second=arguments.images_per_second
        )
        seed = entry["other_seeds"][-1]
        print(
            f"Added seed {seed['seed']} to {arguments.name}: test error {100 * seed['test_error']:.2f} %; "
            f"{len(zoo_tables.seed_values(entry, 'test_error'))} seeds: {zoo_tables.percent(entry, 'test_error')} %."
        )
        return 0
    entry = zoo.publish(
        arguments.run_dir,
        arguments.name,
        arguments.data_dir,
        images_per_second=arguments.images_per_second,
        weights=arguments.weights,
    )
    print(
        f"Published {arguments.name}: {entry['file']} ({entry['bytes'] / 2**20:.1f} MB, sha256 "
        f"{entry['sha256'][:16]}), test error {100 * entry['test_error']:.2f} %."
    )
    return 0
