"""The KerasHub format: a classifier preset of the network under `<version>/kerashub/`, the
directory `keras_hub.models.ImageClassifier.from_preset` (and `Backbone.from_preset`) loads
once `keras_preact` is imported (`keras_preact.hub`): the network as it trained (not folded,
so that it fine-tunes), 0-255 pixels in through the preprocessor, probabilities out. Checked
by loading it back with `from_preset` against the network. Not among `--format all`'s: a
preset is for Keras users, not for a server or a device."""

import os

from . import Format, contract, register

# What installs KerasHub.
EXTRA = 'pip install "keras-preact[hub]"'
DIRECTORY = "kerashub"
# The largest difference of probabilities between the preset loaded back and the network:
# float32 rounding only.
TOLERANCE = 1e-5


def require():
    try:
        import keras_hub  # noqa: F401
    except ImportError:
        raise ImportError(f"KerasHub export needs KerasHub (keras-hub is not installed): {EXTRA}") from None


def package_versions():
    import keras_hub

    return {"keras_hub": keras_hub.__version__}


def write(version):
    """Writes the preset of `version` (an `export.versions.Version`) and loads it back; returns
    metadata.json's "kerashub" entry."""
    import numpy as np

    from keras_preact import hub

    preprocessing = version.preprocessing
    classifier = hub.image_classifier(
        version.trained, preprocessing.normalization_mean, preprocessing.normalization_std
    )
    folder = os.path.join(version.path, DIRECTORY)
    classifier.save_to_preset(folder)
    pixels = np.random.default_rng(0).integers(0, 256, size=(4, *preprocessing.shape)).astype(np.float32)
    expected = classifier.predict(pixels, verbose=0)
    difference = np.abs(hub.from_preset(folder).predict(pixels, verbose=0) - expected).max()
    if not difference <= TOLERANCE:
        raise ValueError(
            f"The KerasHub preset {DIRECTORY}/ loaded back computes other probabilities than the network: "
            f"difference {difference:.2g}, where float32 rounding stays under {TOLERANCE:g}."
        )
    files = {name: os.path.join(DIRECTORY, name) for name in hub.PRESET_FILES}
    return {DIRECTORY: dict(directory=DIRECTORY, files=files, sha256=contract.digests(version.path, files))}


register(
    Format(
        name="kerashub",
        title="a KerasHub preset",
        files_name="a KerasHub preset",
        precisions=("float32",),
        write=write,
        needed=lambda precision: [os.path.join(DIRECTORY, "task.json"), os.path.join(DIRECTORY, "config.json")],
        written=lambda metadata: list(metadata[DIRECTORY]["files"].values()),
        require=require,
        package_versions=package_versions,
        checked_by="KerasHub's from_preset",
        in_all=False,
        folded=False,
    )
)
