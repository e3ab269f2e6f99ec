"""Trained weights shipped inside the package, loaded the Keras Applications way.

`keras_preact.ResNet20(weights="cifar10")` loads the weights that keras-preact trained
for exactly that network: the registry (`keras_preact/weights/registry.json`, data)
names each file with its SHA-256, the network it belongs to, its final test error and
the recipe that made it. Every load checks the file's SHA-256 first: a corrupt,
truncated or altered file is an error that names it, never a silent load.

The networks take images normalised with `preprocess_input` (the per-channel mean and
standard deviation of their data set, CIFAR-10 or CIFAR-100, on the 0-255 scale, as in
training), or 0-255 pixels when built with `include_preprocessing=True`;
`decode_predictions` names the classes.
"""

import json
import os

import keras
from keras import ops
from numpy.typing import ArrayLike

from keras_preact import defaults
from keras_preact.checksums import sha256

WEIGHTS_DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights")
REGISTRY_FILE = os.path.join(WEIGHTS_DIRECTORY, "registry.json")
# CIFAR-10's class names in the order of its label ids 0-9 (Krizhevsky, 2009).
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
# CIFAR-100's fine class names in the order of its fine label ids 0-99, the release's
# `fine_label_names` (Krizhevsky, 2009): alphabetical, so an image folder's sorted class
# folders have the same ids.
CIFAR100_CLASSES = (
    "apple",
    "aquarium_fish",
    "baby",
    "bear",
    "beaver",
    "bed",
    "bee",
    "beetle",
    "bicycle",
    "bottle",
    "bowl",
    "boy",
    "bridge",
    "bus",
    "butterfly",
    "camel",
    "can",
    "castle",
    "caterpillar",
    "cattle",
    "chair",
    "chimpanzee",
    "clock",
    "cloud",
    "cockroach",
    "couch",
    "crab",
    "crocodile",
    "cup",
    "dinosaur",
    "dolphin",
    "elephant",
    "flatfish",
    "forest",
    "fox",
    "girl",
    "hamster",
    "house",
    "kangaroo",
    "keyboard",
    "lamp",
    "lawn_mower",
    "leopard",
    "lion",
    "lizard",
    "lobster",
    "man",
    "maple_tree",
    "motorcycle",
    "mountain",
    "mouse",
    "mushroom",
    "oak_tree",
    "orange",
    "orchid",
    "otter",
    "palm_tree",
    "pear",
    "pickup_truck",
    "pine_tree",
    "plain",
    "plate",
    "poppy",
    "porcupine",
    "possum",
    "rabbit",
    "raccoon",
    "ray",
    "road",
    "rocket",
    "rose",
    "sea",
    "seal",
    "shark",
    "shrew",
    "skunk",
    "skyscraper",
    "snail",
    "snake",
    "spider",
    "squirrel",
    "streetcar",
    "sunflower",
    "sweet_pepper",
    "table",
    "tank",
    "telephone",
    "television",
    "tiger",
    "tractor",
    "train",
    "trout",
    "tulip",
    "turtle",
    "wardrobe",
    "whale",
    "willow_tree",
    "wolf",
    "woman",
    "worm",
)
# The data sets of shipped weights: their classes, input shape and normalisation.
DATASETS = {
    "cifar10": dict(
        classes=CIFAR10_CLASSES, input_shape=(32, 32, 3), mean=defaults.CIFAR10_MEAN, std=defaults.CIFAR10_STD
    ),
    "cifar100": dict(
        classes=CIFAR100_CLASSES, input_shape=(32, 32, 3), mean=defaults.CIFAR100_MEAN, std=defaults.CIFAR100_STD
    ),
}


# What every registry entry must hold for a network to load (the rest documents it).
REGISTRY_FIELDS = ("file", "sha256", "test_error")


def registry(path=None):
    """{data set: {model name: entry}}: every shipped weights file, from the registry
    (`path`, by default `REGISTRY_FILE`, read at call time).

    Raises:
        ValueError: naming the registry file, if it is not valid JSON or an entry lacks
            one of `REGISTRY_FIELDS` (an edited or damaged file: reinstall keras-preact).
    """
    path = path or REGISTRY_FILE
    remedy = "reinstall keras-preact, or restore the file"
    try:
        with open(path, "rb") as file:
            entries = json.load(file)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ValueError(f"The weights registry {path} is not valid JSON ({str(error)[:120]}): {remedy}.") from None
    if not isinstance(entries, dict):
        raise ValueError(
            f"The weights registry {path} must map data sets to networks: {remedy}. Received: {type(entries).__name__}"
        )
    for dataset, networks in entries.items():
        for model_name, entry in networks.items() if isinstance(networks, dict) else [(None, networks)]:
            missing = [field for field in REGISTRY_FIELDS if not isinstance(entry, dict) or field not in entry]
            if missing:
                where = dataset if model_name is None else f"{dataset}.{model_name}"
                raise ValueError(
                    f"The weights registry {path} is damaged: its entry {where} lacks {', '.join(missing)}: {remedy}."
                )
    return entries


def shipped_networks(dataset):
    """The model names (`keras_preact.list_models()` names) with weights for `dataset`."""
    return sorted(registry().get(dataset, {}))


def find(dataset, model_name, classes, input_shape, include_top, other_options=None):
    """The registry entry of `dataset`'s weights for the network described, checked to be
    exactly the network they were trained as: `model_name` (a `keras_preact.list_models()`
    name, or `None` for a network that has none), `classes` (where `include_top`),
    `input_shape`, and no `other_options` ({argument: value} of `keras_preact.ResNet`
    that differ from the architecture's own: another shortcut, merge or stride).

    Raises:
        ValueError: for an unknown data set, or a network that has no weights for it (the
            message lists those that have).
    """
    if dataset not in DATASETS:
        raise ValueError(
            f"weights must be None, the path of a weights file, or one of {sorted(DATASETS)} for "
            f"trained weights. Received: weights={dataset!r}"
        )
    entries = registry().get(dataset, {})
    available = ", ".join(sorted(entries)) or "none yet"
    expected_shape = DATASETS[dataset]["input_shape"]
    differences = [f"model={model_name!r}"] if model_name not in entries else []
    if include_top and classes != len(DATASETS[dataset]["classes"]):
        differences.append(f"classes={classes!r} (the weights have {len(DATASETS[dataset]['classes'])})")
    if tuple(input_shape) != expected_shape:
        differences.append(f"input_shape={tuple(input_shape)} (the weights take {expected_shape})")
    differences += [f"{option}={value!r}" for option, value in (other_options or {}).items()]
    if differences:
        raise ValueError(
            f"keras-preact ships {dataset} weights for these networks only, each with its default shortcut, "
            f"merge and stride, {expected_shape} inputs and {len(DATASETS[dataset]['classes'])} classes: "
            f"{available}. Received: {', '.join(differences)}"
        )
    return entries[model_name]


def verified_file(entry):
    """The path of an entry's weights file, after checking its SHA-256 against the registry's.

    Raises:
        FileNotFoundError: if the file is missing.
        ValueError: if its SHA-256 differs (a corrupt, truncated or altered file).
    """
    path = os.path.join(WEIGHTS_DIRECTORY, entry["file"])
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"The weights file {path} is missing from the installed package; reinstall "
            f"keras-preact. Expected SHA-256 {entry['sha256']}."
        )
    received = sha256(path)
    if received != entry["sha256"]:
        raise ValueError(
            f"The weights file {path} is corrupt or was altered: its SHA-256 is {received}, the registry's "
            f"{entry['sha256']}. Reinstall keras-preact. Received: sha256={received}"
        )
    return path


def preprocess_input(images: ArrayLike, dataset: str = "cifar10") -> keras.KerasTensor:
    """Normalises 0-255 pixels as the shipped networks were trained: (pixels - mean) / std
    per channel, with the statistics of the weights' data set (`keras_preact.defaults`:
    `CIFAR10_MEAN` and `_STD`, `CIFAR100_MEAN` and `_STD`).

    Args:
        images: pixels 0-255, channels last (a NumPy array or tensor of any float or int type).
        dataset: the data set of the weights, "cifar10" or "cifar100".

    Returns:
        float32 images, for a network built without `include_preprocessing`.
    """
    statistics = _dataset(dataset)
    if ops.shape(images)[-1] != len(statistics["mean"]):
        raise ValueError(
            f"images must have {len(statistics['mean'])} channels, last. Received: images of shape "
            f"{tuple(ops.shape(images))}"
        )
    images = ops.cast(images, "float32")
    return (images - ops.array(statistics["mean"], "float32")) / ops.array(statistics["std"], "float32")


def normalization(mean, std, name="normalization"):
    """(pixels - mean) / std per channel, as a Keras layer: `preprocess_input` inside a model
    (`include_preprocessing=True`), and training's normalisation."""
    return keras.layers.Normalization(mean=mean, variance=[value**2 for value in std], name=name)


def decode_predictions(
    predictions: ArrayLike, top: int = 5, dataset: str = "cifar10"
) -> list[list[tuple[int, str, float]]]:
    """The `top` classes of each row of `predictions` (probabilities or logits of the data set's
    classes: "cifar10" or "cifar100", whose names are its fine classes), best first, as Keras
    Applications' `decode_predictions` gives them.

    Returns:
        A list with, per image, a list of (class id, class name, score) tuples.

    Example:

    >>> keras_preact.decode_predictions(model.predict(images), top=3)[0]
    [(3, 'cat', 0.91), (5, 'dog', 0.05), (2, 'bird', 0.01)]
    """
    names = _dataset(dataset)["classes"]
    predictions = ops.convert_to_numpy(predictions)
    if predictions.ndim != 2 or predictions.shape[1] != len(names):
        raise ValueError(
            f"predictions must be (images, {len(names)}) for {dataset}. Received: predictions of shape "
            f"{predictions.shape}"
        )
    if not isinstance(top, int) or isinstance(top, bool) or not 1 <= top <= len(names):
        raise ValueError(f"top must be an integer from 1 to {len(names)}. Received: top={top!r}")
    ranked = (-predictions).argsort(axis=1, kind="stable")[:, :top]
    return [
        [(int(index), names[index], float(row[index])) for index in order] for row, order in zip(predictions, ranked)
    ]


def dataset_of(class_names):
    """The data set of shipped weights whose classes are `class_names` in this order ("cifar10",
    "cifar100"), or `None`: how a weights file's network is given its data set's normalisation."""
    return next((name for name, facts in DATASETS.items() if list(facts["classes"]) == list(class_names)), None)


def _dataset(dataset):
    if dataset not in DATASETS:
        raise ValueError(f"dataset must be one of {sorted(DATASETS)}. Received: dataset={dataset!r}")
    return DATASETS[dataset]
