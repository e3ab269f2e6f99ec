"""SavedModel export: signatures that match the Keras model, TF Serving's layout, metadata."""

import json
import os
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_preact
from keras_preact_training import export
from keras_preact_training.data import datasets, input_tensorflow
from keras_preact_training.export import contract, saved_model, sources
from keras_preact_training.train import named_configs
from tests.conftest import KERAS_PREACT

pytestmark = pytest.mark.tensorflow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CIFAR = export.Preprocessing.of(named_configs.CONFIGS["cifar10_paper"], channels=3)
DIGITS = export.Preprocessing.of(named_configs.CONFIGS["digits_demo"], channels=1)
CIFAR_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
BATCH_SIZES = (1, 5)


def random_pixels(count, preprocessing, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(count, *preprocessing.shape), dtype=np.uint8)


def normalize(pixels, preprocessing):
    """(pixels - mean) / std, written out as training's Keras `Normalization` computes it in
    float32 (dividing by the square root of the variance std^2). An untrained ResNet-1001
    with set statistics turns a relative input change of 1e-7 into 10 % of its logits
    (measured), so the reference must round exactly as the exported graph does."""
    mean = np.array(preprocessing.normalization_mean, "float32")
    root_variance = np.sqrt(np.array([std**2 for std in preprocessing.normalization_std], "float32"))
    return (np.asarray(pixels, "float32") - mean) / root_variance


def calibrated(network, preprocessing, pixels):
    """`network` with the BatchNorm statistics of `pixels` (an untrained deep net overflows without)."""
    keras_preact.analysis.set_batch_norm_statistics(network, normalize(pixels, preprocessing))
    return network


def expected_outputs(network, normalized, class_names, top_k):
    """What every signature must return, computed from the Keras model in NumPy."""
    probabilities = np.array(network(normalized, training=False))
    classifier = network.layers[-1]
    if keras.activations.serialize(classifier.activation) == "softmax":
        features = np.array(keras.Model(network.input, classifier.input)(normalized, training=False))
        logits = features @ np.array(classifier.kernel) + np.array(classifier.bias)
        np.testing.assert_allclose(np.array(keras.ops.softmax(logits)), probabilities, atol=1e-6)
    else:
        logits, probabilities = probabilities, np.array(keras.ops.softmax(probabilities))
    ranked = np.argsort(-probabilities, axis=-1, kind="stable")[:, :top_k]
    return dict(
        logits=logits,
        probabilities=probabilities,
        class_ids=np.argmax(logits, -1),
        classes=np.array(class_names, dtype=object)[ranked],
        scores=np.take_along_axis(probabilities, ranked, -1),
    )


def assert_outputs_match(outputs, expected):
    assert sorted(outputs) == sorted(contract.OUTPUTS)
    scale = np.abs(expected["logits"]).max()
    np.testing.assert_allclose(outputs["logits"].numpy(), expected["logits"], atol=1e-5 * scale, rtol=1e-5)
    np.testing.assert_allclose(outputs["probabilities"].numpy(), expected["probabilities"], atol=1e-5)
    np.testing.assert_allclose(outputs["scores"].numpy(), expected["scores"], atol=1e-5)
    np.testing.assert_array_equal(outputs["class_ids"].numpy(), expected["class_ids"])
    assert outputs["classes"].numpy().astype(str).tolist() == expected["classes"].astype(str).tolist()


def assert_signatures_match(network, path, preprocessing, class_names, pixels, top_k=export.DEFAULT_TOP_K):
    """Every signature of the reloaded SavedModel equals the Keras model, at each batch size."""
    signatures = tf.saved_model.load(path).signatures
    assert sorted(signatures) == sorted(contract.SIGNATURES)
    for batch_size in BATCH_SIZES:
        batch = pixels[:batch_size]
        normalized = normalize(batch, preprocessing)
        expected = expected_outputs(network, normalized, class_names, min(top_k, len(class_names)))
        # PNG is lossless: the encoded images decode to exactly `batch`.
        encoded = tf.constant([tf.io.encode_png(image).numpy() for image in batch])
        assert_outputs_match(signatures["serving_default"](images=encoded), expected)
        assert_outputs_match(signatures["predict_pixels"](pixels=tf.constant(batch)), expected)
        assert_outputs_match(signatures["predict_normalized"](normalized=tf.constant(normalized)), expected)


@pytest.fixture(scope="module")
def resnet20_export(tmp_path_factory):
    pixels = random_pixels(16, CIFAR)
    network = calibrated(keras_preact.ResNet20(input_shape=CIFAR.shape, classes=10), CIFAR, pixels)
    directory = tmp_path_factory.mktemp("saved_models") / "cifar10_resnet20"
    path = export.export_saved_model(network, str(directory), CIFAR_CLASSES, CIFAR, verbose=False)
    return network, path, pixels


def test_versioned_layout_and_metadata(resnet20_export):
    network, path, _ = resnet20_export
    assert os.path.basename(path) == "1"
    assert {"saved_model.pb", "variables", contract.METADATA_FILE} <= set(os.listdir(path))
    metadata = contract.read_metadata(path)
    assert metadata["name"] == "cifar10_resnet20" and metadata["version"] == 1
    assert metadata["class_names"] == CIFAR_CLASSES and metadata["network"] == network.name
    assert metadata["input"] == dict(
        image_size=32,
        channels=3,
        normalization_mean=[125.3, 123.0, 113.9],
        normalization_std=[63.0, 62.1, 66.7],
        crop="resize",
        pixel_range=[0, 255],
    )
    assert sorted(metadata["signatures"]) == sorted(contract.SIGNATURES) and metadata["top_k"] == 5
    assert metadata["signatures"] == {
        "serving_default": "images: tf.string [batch], encoded JPEG/PNG/GIF/BMP images of any size",
        "predict_pixels": "pixels: tf.uint8 [batch, 32, 32, 3], 0-255",
        "predict_normalized": "normalized: tf.float32 [batch, 32, 32, 3], (pixels - normalization_mean) / "
        "normalization_std",
    }
    assert metadata["folded_batch_norms"] == 10  # the stem's and the middle one of each of 9 units


@pytest.mark.parametrize(
    "name, build, preprocessing, class_names",
    [
        (
            "pre-activation ResNet-20",
            lambda: keras_preact.ResNet20(input_shape=CIFAR.shape, classes=10),
            CIFAR,
            CIFAR_CLASSES,
        ),
        (
            "bottleneck ResNet-29",
            lambda: keras_preact.CifarResNet(29, "bottleneck", input_shape=CIFAR.shape, classes=10),
            CIFAR,
            CIFAR_CLASSES,
        ),
        (
            "original ResNet-20, logits",
            lambda: keras_preact.get_model(
                "resnet20_original", input_shape=CIFAR.shape, classes=10, classifier_activation=None
            ),
            CIFAR,
            CIFAR_CLASSES,
        ),
        (
            "bottleneck ResNet-29, units in loops",
            lambda: keras_preact.CifarResNet(29, "bottleneck", input_shape=CIFAR.shape, classes=10, scan_units=True),
            CIFAR,
            CIFAR_CLASSES,
        ),
        (
            "grey 8x8 digits, 3 of 12 classes",
            lambda: keras_preact.ResNet20(input_shape=DIGITS.shape, classes=12),
            DIGITS,
            [f"digit {index}" for index in range(12)],
        ),
    ],
)
def test_reloaded_signatures_match_the_keras_model(tmp_path, name, build, preprocessing, class_names):
    pixels = random_pixels(8, preprocessing, seed=1)
    network = calibrated(build(), preprocessing, pixels)
    top_k = 3 if preprocessing is DIGITS else export.DEFAULT_TOP_K
    path = export.export_saved_model(
        network, str(tmp_path / "model"), class_names, preprocessing, top_k=top_k, verbose=False
    )
    assert_signatures_match(network, path, preprocessing, class_names, pixels, top_k)


@pytest.fixture
def without_remapping():
    """Grappler's remapper off: it fuses each convolution with the fused BatchNorm that follows
    in the SavedModel's graph (oneDNN's _FusedConv2D), which rounds otherwise than the two ops
    run apart, and an untrained ResNet-1001 turns that 1e-7 into 0.5 % of its logits (measured;
    0.0 without the remapper). The ResNet-1001 tests check what the export builds, exactly:
    the network with its BatchNorms folded (folding rounds otherwise than BatchNorm, which
    such a network amplifies in the same way; tests/test_folding.py holds folding to float32
    rounding on networks that do not)."""
    tf.config.optimizer.set_experimental_options({"remapping": False})
    yield
    tf.config.optimizer.set_experimental_options({"remapping": True})


@pytest.mark.slow
@pytest.mark.usefixtures("without_remapping")
def test_resnet1001_with_set_statistics_exports_exactly(tmp_path):
    """ResNet-1001 in inference mode: finite, and every signature equal to Keras (about 3 min;
    the default run exports ResNet-1001 with its units as loops, below)."""
    pixels = random_pixels(8, CIFAR, seed=2)
    network = calibrated(keras_preact.ResNet1001(input_shape=CIFAR.shape, classes=10, scan_units=False), CIFAR, pixels)
    path = export.export_saved_model(network, str(tmp_path / "resnet1001"), CIFAR_CLASSES, CIFAR, verbose=False)
    assert_signatures_match(keras_preact.fold_batch_norms(network), path, CIFAR, CIFAR_CLASSES, pixels)


@pytest.mark.usefixtures("without_remapping")
def test_resnet1001_in_loops_exports_exactly(tmp_path):
    """The same with units in loops: about 30 s where one layer per unit takes minutes."""
    pixels = random_pixels(8, CIFAR, seed=2)
    network = calibrated(keras_preact.ResNet1001(input_shape=CIFAR.shape, classes=10, scan_units=True), CIFAR, pixels)
    path = export.export_saved_model(network, str(tmp_path / "resnet1001"), CIFAR_CLASSES, CIFAR, verbose=False)
    assert_signatures_match(keras_preact.fold_batch_norms(network), path, CIFAR, CIFAR_CLASSES, pixels)


def test_encoded_images_are_preprocessed_as_in_training(resnet20_export, cifar_folder):
    """serving_default on CIFAR-10's PNG files equals the network on the training pipeline's images."""
    network, path, _ = resnet20_export
    config = named_configs.CONFIGS["cifar10_paper"].override(
        "dataset=folder", f"data_dir={cifar_folder}", "test_examples=12"
    )
    split = datasets.load(config).test
    images, _ = next(iter(input_tensorflow.evaluation_batches(split, 12)))
    expected = expected_outputs(network, normalize(images, CIFAR), CIFAR_CLASSES, export.DEFAULT_TOP_K)
    encoded = tf.constant([tf.io.read_file(str(file)).numpy() for file in split.items])
    outputs = tf.saved_model.load(path).signatures["serving_default"](images=encoded)
    assert_outputs_match(outputs, expected)
    # Any image size: a 48 x 40 JPEG is resized to 32 x 32 as the training pipeline resizes.
    large = tf.io.encode_jpeg(tf.image.resize(tf.io.decode_jpeg(encoded[0]), (48, 40), "nearest")).numpy()
    resized = np.array(input_tensorflow.resize(input_tensorflow.decode_image(large, 3), 32))[None]
    expected = expected_outputs(network, normalize(resized, CIFAR), CIFAR_CLASSES, 5)
    assert_outputs_match(tf.saved_model.load(path).signatures["serving_default"](images=tf.constant([large])), expected)


def test_saved_model_cli_lists_the_signatures(resnet20_export):
    _, path, _ = resnet20_export
    command = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    result = subprocess.run(
        [command, "show", "--dir", path, "--all"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert result.returncode == 0, result.stderr[-2000:]
    shown = result.stdout
    for signature, (input_name, dtype, shape) in {
        "serving_default": ("images", "DT_STRING", "(-1)"),
        "predict_pixels": ("pixels", "DT_UINT8", "(-1, 32, 32, 3)"),
        "predict_normalized": ("normalized", "DT_FLOAT", "(-1, 32, 32, 3)"),
    }.items():
        section = shown.split(f"signature_def['{signature}']:")[1].split("signature_def[")[0]
        assert f"inputs['{input_name}'] tensor_info:\n        dtype: {dtype}\n        shape: {shape}" in section
        for output, output_type in (
            ("logits", "DT_FLOAT"),
            ("probabilities", "DT_FLOAT"),
            ("class_ids", "DT_INT64"),
            ("classes", "DT_STRING"),
            ("scores", "DT_FLOAT"),
        ):
            assert f"outputs['{output}'] tensor_info:\n        dtype: {output_type}" in section
        assert "Method name is: tensorflow/serving/predict" in section


def test_versions_count_up_and_are_never_overwritten(resnet20_export, tmp_path):
    network, _, _ = resnet20_export
    directory = str(tmp_path / "model")
    first = export.export_saved_model(network, directory, CIFAR_CLASSES, CIFAR, verbose=False)
    second = export.export_saved_model(network, directory, CIFAR_CLASSES, CIFAR, verbose=False)
    assert [os.path.basename(first), os.path.basename(second)] == ["1", "2"]
    assert contract.latest_version(directory) == second
    with pytest.raises(FileExistsError, match="Received: version=2"):
        export.export_saved_model(network, directory, CIFAR_CLASSES, CIFAR, version=2, verbose=False)
    assert sorted(os.listdir(directory)) == ["1", "2"]  # nothing half-written left behind


@pytest.mark.parametrize("name", ["bad\udcffbyte", "new\nline"])
def test_an_export_folder_tensorflow_cannot_name_is_refused_before_writing(resnet20_export, tmp_path, name):
    network, _, _ = resnet20_export
    directory = str(tmp_path / name / "model")
    with pytest.raises(ValueError, match=r"directory must be a path of printable UTF-8 characters .* Received: "):
        export.export_saved_model(network, directory, CIFAR_CLASSES, CIFAR, verbose=False)
    assert os.listdir(tmp_path) == []


def test_version_folders_are_ascii_digits_up_to_tf_servings_int64(tmp_path):
    for name in ("1", "12", "\u0663", "9223372036854775807", "9223372036854775808", "v3"):
        (tmp_path / name).mkdir()
    (tmp_path / "7").write_text("a file, not a version")
    assert contract.versions(str(tmp_path)) == [1, 12, 2**63 - 1]


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(class_names=CIFAR_CLASSES[:9]), r"one name per output of the network \(10\). Received: 9 names"),
        (dict(version=0), "version must be a positive integer up to 2\\*\\*63 - 1 .*Received: version=0"),
        (dict(version=2**63), "Received: version=9223372036854775808"),
        (dict(top_k=0), "top_k must be a positive integer. Received: top_k=0"),
        (dict(preprocessing=DIGITS), r"input shape \(32, 32, 3\) differs from the preprocessing's \(8, 8, 1\)"),
    ],
)
def test_bad_export_arguments_are_clear_errors(resnet20_export, tmp_path, change, message):
    network, _, _ = resnet20_export
    arguments = dict(
        network=network,
        directory=str(tmp_path / "model"),
        class_names=CIFAR_CLASSES,
        preprocessing=CIFAR,
        verbose=False,
    )
    with pytest.raises(ValueError, match=message):
        export.export_saved_model(**{**arguments, **change})


def test_a_classifier_whose_layers_are_no_chain_exports_unfolded(tmp_path):
    """Any Keras classifier exports; one that is not a chain of layers, as it is."""
    inputs = keras.Input(CIFAR.shape)
    convolved = keras_preact.base_layers.SymmetricConv2D(4, 3, name="conv")(inputs)
    joined = keras.layers.Concatenate()([keras_preact.base_layers.batch_norm(0.0, "bn")(convolved), convolved])
    outputs = keras.layers.Dense(10, activation="softmax")(keras.layers.GlobalAveragePooling2D()(joined))
    network = calibrated(keras.Model(inputs, outputs), CIFAR, random_pixels(8, CIFAR))
    path = export.export_saved_model(network, str(tmp_path / "model"), CIFAR_CLASSES, CIFAR, verbose=False)
    assert contract.read_metadata(path)["folded_batch_norms"] == 0
    assert_signatures_match(network, path, CIFAR, CIFAR_CLASSES, random_pixels(8, CIFAR, seed=3))


def test_a_network_without_classifier_is_refused(tmp_path):
    features = keras_preact.ResNet20(input_shape=CIFAR.shape, include_top=False, pooling="avg")
    with pytest.raises(ValueError, match="last layer is a Dense layer.*Received: a model whose last layer is"):
        export.export_saved_model(features, str(tmp_path / "model"), ["a"] * 64, CIFAR, verbose=False)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(image_size=0), "image_size must be a positive integer. Received: image_size=0"),
        (dict(channels=2), "channels must be 1 or 3. Received: channels=2"),
        (dict(normalization_mean=(1.0,)), r"normalization_mean needs one value per channel \(3\)"),
        (dict(crop="random"), r"crop must be one of \['central_crop', 'resize'\]. Received: crop='random'"),
    ],
)
def test_bad_preprocessing_is_a_clear_error(arguments, message):
    with pytest.raises(ValueError, match=message):
        export.Preprocessing(
            **{
                **dict(image_size=32, channels=3, normalization_mean=(0.0,) * 3, normalization_std=(1.0,) * 3),
                **arguments,
            }
        )


def test_missing_version_is_a_clear_error(tmp_path):
    with pytest.raises(
        FileNotFoundError,
        match=r"No complete version folder with a SavedModel \(<directory>/<number>/"
        r"saved_model.pb and metadata.json\) in ",
    ):
        contract.latest_version(str(tmp_path))


def test_export_command_exports_a_run_and_predicts_with_the_reloaded_model(tmp_path):
    """The end of the README's main job: train (a short digits run), export, predict."""
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow")
    run_dir, output = str(tmp_path / "run"), str(tmp_path / "saved_models")
    trained = subprocess.run(
        [
            KERAS_PREACT,
            "train",
            "--config",
            "digits_demo",
            "--run-dir",
            run_dir,
            "--set",
            "duration=2",
            "--set",
            "evaluate_every=1000",
        ],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    result = subprocess.run(
        [KERAS_PREACT, "export", "--run-dir", run_dir, "--output", output, "--top-k", "3"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    path = os.path.join(output, "digits_resnet20", "1")
    assert f"Exported resnet20 to {path}" in result.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    metadata = contract.read_metadata(path)
    assert metadata["test_error"] == summary["test_error"] and metadata["training_config"] == summary["config"]
    assert metadata["input"]["channels"] == 1 and metadata["input"]["normalization_mean"] == [77.89]
    # The first test digit is a 2 (scikit-learn's 1,438th); the line names the SavedModel's top 3.
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith("The reloaded SavedModel on the first test image (a '2', ") and line.count("%") == 3
    image, label = sources.example_image(run_dir)
    outputs = saved_model.predict_encoded(path, [image])
    training_model = keras.saving.load_model(os.path.join(run_dir, "model.keras"))
    logits = np.array(training_model(tf.cast(tf.io.decode_png(image)[None], tf.float32), training=False))
    np.testing.assert_allclose(outputs["logits"][0], logits[0], atol=1e-4)
    assert label == "2"

    # The same run with its model.keras truncated: an error that names the file, not "File not found".
    damaged = tmp_path / "damaged"
    shutil.copytree(run_dir, damaged)
    model_file = damaged / "model.keras"
    model_file.write_bytes(model_file.read_bytes()[:1000])
    result = subprocess.run(
        [KERAS_PREACT, "export", "--run-dir", str(damaged), "--output", output],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"error: Could not read the run's model {model_file} (a truncated or corrupt file" in result.stderr


def test_export_command_without_a_run_is_a_clear_error(tmp_path):
    result = subprocess.run(
        [KERAS_PREACT, "export", "--run-dir", str(tmp_path / "none")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert result.returncode == 2
    assert "holds no finished training run" in result.stderr and f"Received: '{tmp_path / 'none'}'" in result.stderr


def test_the_contract_is_importable_without_tensorflow_and_names_every_onnx_model():
    """training.contract: what export writes and serving reads, with no TensorFlow import (an
    onnxruntime server can read it), one ONNX model per image-array signature."""
    code = (
        "import sys; from keras_preact_training.export import contract; "
        "print(sorted(contract.SIGNATURES), contract.ONNX_MODELS, 'tensorflow' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "['predict_normalized', 'predict_pixels', 'serving_default'] ('predict_pixels', 'predict_normalized') False"
    )
    assert {contract.SIGNATURES[name].onnx_model for name in contract.SIGNATURES} == set(contract.ONNX_MODELS)
    assert contract.onnx_file("predict_pixels") == os.path.join("onnx", "predict_pixels.onnx")
