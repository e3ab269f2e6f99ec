"""CIFAR-100 wherever CIFAR-10 is: `keras-preact data` on CIFAR-100's release for Python (fine
labels), the `cifar100_zoo` recipe with a weights' average, `publish` into the registry's
"cifar100" entries, `weights="cifar100"` with 100 classes and CIFAR-100's normalisation,
`decode_predictions` with its fine names, `evaluate`, the zoo's CIFAR-100 tables, every export
format and both serving runtimes. The release is written by the test (random pixels, the real
class names), so that nothing here needs the shared data."""

import json
import os
import pickle
import subprocess
import tarfile

import keras
import numpy as np
import pytest

import keras_preact
from keras_preact import defaults, pretrained
from tests.conftest import KERAS_PREACT, ROOT

pytestmark = pytest.mark.tensorflow
# Images per class the test's release holds, in each split.
TRAINING_PER_CLASS, TEST_PER_CLASS = 2, 1


def cifar100_release(path, seed=0):
    """A `cifar-100-python.tar.gz` of CIFAR-100's release format (pickles of protocol 2 with bytes
    keys: `train` and `test` with `data`, `fine_labels` and `coarse_labels`, `meta` with the fine
    and coarse names), its images random, its classes interleaved as the release's are.
    Returns (path, {split: (images, fine labels)})."""
    rng = np.random.default_rng(seed)
    folder = path.parent / "cifar-100-python"
    folder.mkdir()
    splits = {}
    for split, per_class in (("train", TRAINING_PER_CLASS), ("test", TEST_PER_CLASS)):
        labels = rng.permutation(np.repeat(np.arange(100), per_class))
        images = rng.integers(0, 256, (len(labels), 32, 32, 3), dtype=np.uint8)
        splits[split] = (images, labels)
        batch = {
            b"data": images.transpose(0, 3, 1, 2).reshape(len(images), -1),
            b"fine_labels": [int(label) for label in labels],
            b"coarse_labels": [int(label) // 5 for label in labels],
            b"filenames": [f"{index}.png".encode() for index in range(len(labels))],
        }
        with open(folder / split, "wb") as file:
            pickle.dump(batch, file, protocol=2)
    meta = {
        b"fine_label_names": [name.encode() for name in pretrained.CIFAR100_CLASSES],
        b"coarse_label_names": [f"coarse{index}".encode() for index in range(20)],
    }
    with open(folder / "meta", "wb") as file:
        pickle.dump(meta, file, protocol=2)
    with tarfile.open(path, "w:gz") as archive:
        archive.add(folder, "cifar-100-python")
    return path, splits


@pytest.fixture(scope="module")
def release_folder(tmp_path_factory):
    """The image folder `keras-preact data` makes from the test's release into the cache it is
    given (XDG_CACHE_HOME): (folder, the release's splits)."""
    root = tmp_path_factory.mktemp("cifar100")
    archive, splits = cifar100_release(root / "cifar-100-python.tar.gz")
    made = subprocess.run(
        [KERAS_PREACT, "data", str(archive)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, XDG_CACHE_HOME=str(root / "cache")),
    )
    folder = root / "cache" / "keras-preact" / "cifar100-png"
    assert made.returncode == 0, made.stderr
    assert made.stdout == f"Made: {folder}, 200 training and 100 test images in 100 classes.\n"
    return folder, splits


def test_data_writes_the_release_as_png_folders_of_the_fine_classes(release_folder):
    from PIL import Image

    folder, splits = release_folder
    assert sorted(os.listdir(folder / "train")) == sorted(pretrained.CIFAR100_CLASSES)
    images, labels = splits["train"]
    for label in (0, 41, 99):  # NNNN: the image's index within its class in the release's order
        name = pretrained.CIFAR100_CLASSES[label]
        assert sorted(os.listdir(folder / "train" / name)) == ["0000.png", "0001.png"]
        for index, image in enumerate(images[labels == label]):
            np.testing.assert_array_equal(np.asarray(Image.open(folder / "train" / name / f"{index:04d}.png")), image)


def test_the_library_names_cifar100_and_refuses_networks_without_its_weights():
    assert len(pretrained.CIFAR100_CLASSES) == 100 and list(pretrained.CIFAR100_CLASSES) == sorted(
        pretrained.CIFAR100_CLASSES
    )
    assert pretrained.dataset_of(pretrained.CIFAR100_CLASSES) == "cifar100"
    assert pretrained.dataset_of(pretrained.CIFAR10_CLASSES) == "cifar10"
    assert pretrained.dataset_of(["cat", "dog"]) is None
    logits = np.zeros((1, 100), "float32")
    logits[0, [3, 99]] = [2.0, 1.0]
    assert keras_preact.decode_predictions(logits, top=2, dataset="cifar100") == [[(3, "bear", 2.0), (99, "worm", 1.0)]]
    normalized = keras.ops.convert_to_numpy(keras_preact.preprocess_input(np.full((1, 1, 1, 3), 129.3), "cifar100"))
    np.testing.assert_allclose(
        normalized[0, 0, 0], (np.array([129.3] * 3) - defaults.CIFAR100_MEAN) / defaults.CIFAR100_STD, rtol=1e-6
    )
    with pytest.raises(
        ValueError, match=r"^keras-preact ships cifar100 weights for these networks only.*100 classes: "
    ):
        keras_preact.ResNet1001(weights="cifar100")
    with pytest.raises(ValueError, match=r"classes=10 \(the weights have 100\)$"):
        keras_preact.ResNet20(weights="cifar100", classes=10)


def test_a_cifar100_run_with_an_average_is_published_loaded_evaluated_exported_and_served(
    release_folder, tmp_path, monkeypatch
):
    from keras_preact_training import cli, export
    from keras_preact_training.experiments import zoo, zoo_tables
    from keras_preact_training.train import evaluate
    from tests.test_serving import Client, b64, start_server, stop_server

    folder, _ = release_folder
    monkeypatch.setattr(pretrained, "WEIGHTS_DIRECTORY", str(tmp_path / "weights"))
    monkeypatch.setattr(pretrained, "REGISTRY_FILE", str(tmp_path / "weights" / "registry.json"))
    run_dir = tmp_path / "run"
    training = ["train", "--config", "cifar100_zoo", "--model", "resnet20", "--data-dir", str(folder)]
    settings = ["batch_size=50", "duration=2", "warmup=0", "precision=float32", "average_momentum=0.5", "swa_start=0.5"]
    assert cli.main([*training, "--run-dir", str(run_dir), *(part for s in settings for part in ("--set", s))]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["class_names"] == list(pretrained.CIFAR100_CLASSES) and summary["steps"] == 8
    assert summary["config"]["normalization_mean"] == list(defaults.CIFAR100_MEAN)

    with pytest.raises(
        ValueError, match=r"^weights must be one of \['average', 'final', 'swa'\]. Received: weights='best'$"
    ):
        zoo.publish(str(run_dir), "resnet20", weights="best")
    # The equal average (SWA) of the two epochs' ends (steps 4 and 8), shipped, then replaced by
    # the moving average.
    assert summary["swa_weights_sha256"] not in (summary["weights_sha256"], summary["average_weights_sha256"])
    entry = zoo.publish(str(run_dir), "resnet20", weights="swa")
    assert entry["weights"] == "swa" and abs(entry["test_error"] - summary["swa_test_error"]) <= zoo.AGREEMENT
    assert abs(entry["final_weights"]["test_error"] - summary["test_error"]) <= zoo.AGREEMENT
    assert (
        zoo_tables.markdown_table(dataset="cifar100")
        .splitlines()[2]
        .startswith(
            f"| resnet20 | pre-activation | 0.28M | **{100 * entry['test_error']:.2f}** (weights' equal average (SWA); "
            f"trained weights {100 * entry['final_weights']['test_error']:.2f}) | "
        )
    )
    entry = zoo.publish(str(run_dir), "resnet20", weights="average")
    assert entry["file"] == "cifar100_resnet20.weights.h5" and entry["weights"] == "average"
    assert entry["data"] == zoo.DATA_DESCRIPTIONS["cifar100"] and entry["parameters"] == 275_572
    assert abs(entry["test_error"] - summary["average_test_error"]) <= zoo.AGREEMENT
    assert abs(entry["final_weights"]["test_error"] - summary["test_error"]) <= zoo.AGREEMENT
    assert list(pretrained.registry()) == ["cifar100"]
    row = zoo_tables.markdown_table(dataset="cifar100").splitlines()[2]
    assert row.startswith(
        f"| resnet20 | pre-activation | 0.28M | **{100 * entry['test_error']:.2f}** (weights' average; trained "
        f"weights {100 * entry['final_weights']['test_error']:.2f}) | "
    )
    assert "| 31.5 |" in row  # chenyaofo's CIFAR-100 ResNet-20

    # weights="cifar100": 100 classes by default, CIFAR-100's normalisation, the average's weights.
    model = keras_preact.ResNet20(weights="cifar100", include_preprocessing=True, classifier_activation=None)
    assert model.output_shape == (None, 100)
    np.testing.assert_allclose(model.get_layer("preprocessing").mean.numpy().ravel(), defaults.CIFAR100_MEAN)
    average = keras.saving.load_model(run_dir / "model_average.keras").layers[-1]
    for got, want in zip(model.layers[-1].get_weights(), average.layers[-1].get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    tested = evaluate.evaluate("resnet20", "cifar100", data_dir=str(folder))
    assert tested["error"] == entry["test_error"] and len(entry["test_predictions"]) == 2 * tested["images"]
    np.testing.assert_array_equal(zoo.predictions_of(entry["test_predictions"], 100), tested["predictions"])

    # Every format of the shipped network; both runtimes answer with CIFAR-100's fine names.
    version = export.export_shipped(
        "resnet20", "cifar100", output=str(tmp_path / "saved_models"), formats=tuple(export.FORMATS), verbose=False
    )
    metadata = json.loads((tmp_path / "saved_models" / "cifar100_resnet20" / "1" / "metadata.json").read_text())
    assert metadata["dataset"] == "cifar100" and sorted(metadata["formats"]) == [
        "kerashub",
        "litert",
        "onnx",
        "saved_model",
    ]
    assert metadata["input"]["normalization_mean"] == list(defaults.CIFAR100_MEAN)
    paths = sorted(str(path) for path in (folder / "test").glob("*/0000.png"))[:4]
    expected = keras_preact.decode_predictions(
        model.predict(np.stack([np.asarray(keras.utils.load_img(path)) for path in paths]), verbose=0),
        top=1,
        dataset="cifar100",
    )
    assert [ranked[0][0] for ranked in export.classify(version, export.read_image_files(paths))] == [
        best[0][1] for best in expected
    ]
    for runtime in ("onnxruntime", "tensorflow"):
        server, port = start_server(tmp_path / "saved_models" / "cifar100_resnet20", "--runtime", runtime)
        try:
            encoded = [open(path, "rb").read() for path in paths]
            status, answer = Client(f"http://127.0.0.1:{port}").post(
                "/v1/models/cifar100_resnet20:predict", {"instances": [b64(image) for image in encoded]}
            )
        finally:
            stop_server(server)
        assert status == 200, answer
        assert [prediction["classes"][0] for prediction in answer["predictions"]] == [
            best[0][1] for best in expected
        ], runtime
