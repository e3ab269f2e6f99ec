"""`export --quantize float16 int8`: the shipped ResNet-20 in every precision, calibrated on
CIFAR-10 training images, against the network on test images; int8 ONNX served by onnxruntime
(`serve --precision int8`) with the checks of every served file; the errors of each input."""

import base64
import json
import os
import shutil

import numpy as np
import pytest
from PIL import Image

import keras_preact
from keras_preact import pretrained
from keras_preact_training import cli, export
from keras_preact_training.data import images, input_tensorflow
from keras_preact_training.export import calibration, contract, litert
from keras_preact_training.serving.model import ModelServer
from keras_preact_training.serving.protocol import BadRequest
from tests.test_export import CIFAR, CIFAR_CLASSES, random_pixels
from tests.test_serving_battery import swap_onnx_files

onnxruntime = pytest.importorskip(
    "onnxruntime", reason='the onnx extra is not installed: pip install "keras-preact[onnx]"'
)
pytest.importorskip(
    "ai_edge_litert", reason='LiteRT\'s interpreter is not installed: pip install "keras-preact[litert]"'
)
pytestmark = pytest.mark.tensorflow

CALIBRATION_PER_CLASS, TEST_PER_CLASS = 20, 100


def first_files(folder, per_class):
    return [
        os.path.join(folder, name, file)
        for name in CIFAR_CLASSES
        for file in sorted(os.listdir(os.path.join(folder, name)))[:per_class]
    ]


@pytest.fixture(scope="module")
def quantized(cifar_folder, tmp_path_factory):
    """The shipped ResNet-20 as ONNX and LiteRT in every precision, calibrated on 200 training images."""
    output = tmp_path_factory.mktemp("quantized")
    return export.export_shipped(
        "resnet20",
        output=str(output),
        formats=("onnx", "litert"),
        precisions=("float32", "float16", "int8"),
        calibration_images=first_files(os.path.join(cifar_folder, "train"), CALIBRATION_PER_CLASS),
        verbose=False,
    )


@pytest.fixture(scope="module")
def test_images(cifar_folder):
    """(the encoded bytes, their pixels as training decodes them, labels) of 1,000 test images."""
    files = first_files(os.path.join(cifar_folder, "test"), TEST_PER_CLASS)
    encoded = [open(file, "rb").read() for file in files]
    pixels = np.stack([input_tensorflow.decode_image(image, 3).numpy() for image in encoded])
    return encoded, pixels, np.repeat(np.arange(10), TEST_PER_CLASS)


def test_every_precision_is_recorded_with_its_file_and_hash(quantized):
    metadata = contract.read_metadata(quantized)
    assert metadata["formats"] == ["onnx", "litert"]
    int8 = contract.onnx_models(metadata, "int8")
    assert int8["files"] == {
        "predict_pixels": "onnx/predict_pixels.int8.onnx",
        "predict_normalized": "onnx/predict_normalized.int8.onnx",
    }
    assert int8["calibration_images"] == 10 * CALIBRATION_PER_CLASS
    assert metadata["litert"]["files"] == {
        precision: f"litert/predict_pixels.{precision}.tflite" for precision in ("float32", "float16", "int8")
    }
    assert metadata["litert"]["calibration_images"] == 10 * CALIBRATION_PER_CLASS
    for described in (contract.onnx_models(metadata), int8, metadata["litert"]):
        for key, file in described["files"].items():
            assert described["sha256"][key] == pretrained.sha256(os.path.join(quantized, file))
    sizes = {
        precision: os.path.getsize(os.path.join(quantized, file))
        for precision, file in metadata["litert"]["files"].items()
    }
    # Half and about a quarter of float32: the weights in 2 and 1 bytes, the graph the same.
    assert 0.45 < sizes["float16"] / sizes["float32"] < 0.55 and sizes["int8"] / sizes["float32"] < 0.35
    onnx_sizes = [
        os.path.getsize(os.path.join(quantized, described["files"]["predict_pixels"]))
        for described in (contract.onnx_models(metadata), int8)
    ]
    assert onnx_sizes[1] / onnx_sizes[0] < 0.4


def test_each_precision_answers_as_the_network_on_cifar_test_images(quantized, test_images):
    """On 1,000 test images the float32 models give the network's probabilities to float32
    rounding; float16 weights move them by at most 1e-2 (5.5e-3 measured on the 10,000) and
    change no class but a rare tie; int8 changes about 1 % of the classes and not the error
    (measured on the 10,000 test images: docs/benchmarks.md)."""
    _, pixels, labels = test_images
    network = keras_preact.get_model("resnet20", weights="cifar10", include_preprocessing=True)
    expected = network.predict(pixels, verbose=0)
    metadata = contract.read_metadata(quantized)

    def onnx(precision):
        file = contract.onnx_models(metadata, precision)["files"]["predict_pixels"]
        session = onnxruntime.InferenceSession(os.path.join(quantized, file), providers=["CPUExecutionProvider"])
        return session.run(["probabilities"], {"pixels": pixels})[0]

    def lite(precision):
        return litert.LiteRTModel(os.path.join(quantized, metadata["litert"]["files"][precision]))(pixels)

    received = {
        "ONNX float32": onnx("float32"),
        "ONNX int8": onnx("int8"),
        **{f"LiteRT {precision}": lite(precision) for precision in ("float32", "float16", "int8")},
    }
    for name in ("ONNX float32", "LiteRT float32"):
        np.testing.assert_allclose(received[name], expected, atol=1e-4, err_msg=name)
    assert np.abs(received["LiteRT float16"] - expected).max() <= 1e-2
    assert (received["LiteRT float16"].argmax(-1) == expected.argmax(-1)).mean() >= 0.995
    error = (expected.argmax(-1) != labels).mean()
    for name in ("ONNX int8", "LiteRT int8"):
        assert (received[name].argmax(-1) == expected.argmax(-1)).mean() >= 0.97, name
        assert abs((received[name].argmax(-1) != labels).mean() - error) <= 0.01, name


def predictions(model, encoded):
    body = json.dumps({"instances": [{"b64": base64.b64encode(image).decode()} for image in encoded]}).encode()
    return model.predict(body)["predictions"]


def test_onnxruntime_serves_the_int8_models_when_asked(quantized, test_images):
    encoded = test_images[0][::10]  # 100 images, 10 a class
    directory = os.path.dirname(quantized)
    servers = {
        precision: ModelServer(directory, max_batch=100, runtime="onnxruntime", precision=precision)
        for precision in ("float32", "int8")
    }
    assert servers["int8"].runtime.name == "onnxruntime, int8"
    int8, float32 = (predictions(servers[precision], encoded) for precision in ("int8", "float32"))
    assert sum(a["classes"][0] == b["classes"][0] for a, b in zip(int8, float32, strict=True)) >= 95
    # The int8 model of the served signature (`serving_default`: decoded, then `predict_normalized`) answered.
    file = contract.onnx_models(servers["int8"].metadata, "int8")["files"]["predict_normalized"]
    session = onnxruntime.InferenceSession(os.path.join(quantized, file), providers=["CPUExecutionProvider"])
    normalized = images.preprocess(encoded, servers["int8"].preprocessing)
    expected = session.run(["probabilities"], {"normalized": normalized})[0]
    np.testing.assert_allclose([answer["probabilities"] for answer in int8], expected, atol=1e-6)
    for answer in int8:
        assert (
            abs(sum(answer["probabilities"]) - 1) < 0.02 and answer["classes"][0] == CIFAR_CLASSES[answer["class_ids"]]
        )


def test_int8_refuses_normalized_inputs_it_would_saturate(quantized, test_images):
    """metadata.json records the float inputs each int8 model quantizes without saturating (its
    input's QuantizeLinear); `predict_normalized` answers inside them (widened to what any pixel
    normalizes to) and refuses values past them (400) where float32 answers."""
    directory = os.path.dirname(quantized)
    servers = {
        precision: ModelServer(directory, runtime="onnxruntime", precision=precision)
        for precision in ("float32", "int8")
    }
    ranges = contract.onnx_models(servers["int8"].metadata, "int8")["input_ranges"]
    assert list(ranges) == ["predict_normalized"]
    lowest, highest = ranges["predict_normalized"]
    calibration = images.preprocess(test_images[0][:50], servers["int8"].preprocessing)
    assert lowest < 0 < highest and (highest - lowest) > 0.5 * (calibration.max() - calibration.min())
    normalized = images.preprocess(test_images[0][:2], servers["int8"].preprocessing)
    for values, int8_status in ((normalized, 200), (normalized * 1000, 400)):
        body = json.dumps({"signature_name": "predict_normalized", "instances": values.tolist()}).encode()
        answers = {}
        for precision, server in servers.items():
            try:
                answers[precision] = (200, server.predict(body))
            except BadRequest as error:
                answers[precision] = (error.status, str(error))
        assert answers["float32"][0] == 200 and answers["int8"][0] == int8_status, answers["int8"]
    assert answers["int8"][1].startswith("The inputs hold values from ")
    assert "outside" in answers["int8"][1] and "the int8 model takes" in answers["int8"][1]


def damaged_copy(quantized, tmp_path, change):
    directory = tmp_path / "cifar10_resnet20"
    shutil.copytree(os.path.dirname(quantized), directory)
    change(directory / os.path.basename(quantized))
    return directory


def without_int8_hashes(version):
    metadata = json.loads((version / "metadata.json").read_text())
    metadata["onnx"]["quantized"]["int8"].pop("sha256")
    (version / "metadata.json").write_text(json.dumps(metadata))


def without_input_ranges(version):
    metadata = json.loads((version / "metadata.json").read_text())
    metadata["onnx"]["quantized"]["int8"].pop("input_ranges")
    (version / "metadata.json").write_text(json.dumps(metadata))


INT8 = "{version}/onnx/predict_pixels.int8.onnx"


def with_int8_settings(version, settings):
    """metadata.json as an export with other int8 settings (None: before they were recorded) wrote it."""
    metadata = json.loads((version / "metadata.json").read_text())
    int8 = metadata["onnx"]["quantized"]["int8"]
    if settings is None:
        int8.pop("settings")
    else:
        int8["settings"] = settings
    (version / "metadata.json").write_text(json.dumps(metadata))


def test_the_int8_onnx_models_cannot_saturate_on_any_x86_64_processor(quantized):
    """onnxruntime multiplies uint8 activations by int8 weights on processors without VNNI
    through an instruction that adds two products into 16 bits: with unsigned activations every
    weight keeps to 7 bits (|w| <= 64, so 255 x 64 x 2 <= 32,767), read from the models' own
    quantized weights and types, whatever processor runs the test; metadata.json records the
    settings."""
    import onnx
    from onnx import numpy_helper

    metadata = contract.read_metadata(quantized)
    int8 = contract.onnx_models(metadata, "int8")
    assert (
        int8["settings"]
        == contract.ONNX_INT8_SETTINGS
        == {
            "format": "QDQ",
            "weights": "int8 from -64 to 64 (onnxruntime's reduced range), per output channel",
            "activations": "uint8",
        }
    )
    for file in int8["files"].values():
        model = onnx.load(os.path.join(quantized, file))
        activations = zero_point_types(model, "QuantizeLinear")  # what the model quantizes as it runs
        assert len(activations) > 20 and set(activations) == {"UINT8"}, f"{file}: activations as {set(activations)}"
        initializers = {tensor.name: tensor for tensor in model.graph.initializer}
        weights = [
            numpy_helper.to_array(initializers[node.input[0]])
            for node in model.graph.node
            if node.op_type == "DequantizeLinear"
            and node.input[0] in initializers
            and initializers[node.input[0]].data_type == onnx.TensorProto.INT8
        ]
        assert len(weights) > 20, file  # every convolution's and the classifier's
        largest = max(int(np.abs(weight.astype(np.int32)).max()) for weight in weights)
        assert largest <= 64, f"{file}: a weight of {largest}, past 7 bits: 255 x {largest} x 2 > 32,767"


def zero_point_types(model, kind):
    """The type names of the zero points of an ONNX model's `kind` nodes (QuantizeLinear, ...)."""
    import onnx

    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    nodes = [node for node in model.graph.node if node.op_type == kind and len(node.input) > 2]
    return [onnx.TensorProto.DataType.Name(initializers[node.input[2]].data_type) for node in nodes]


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda version: (version / "onnx" / "predict_pixels.int8.onnx").write_bytes(b"altered"),
            f"The ONNX model {INT8} is not the one exported with {{version}}/metadata.json: its SHA-256 differs",
        ),
        (
            lambda version: (swap_onnx_files(version, "int8"), without_int8_hashes(version)),
            f"The ONNX model {INT8} takes [('normalized', 'tensor(float)', [None, 32, 32, 3])], where its signature "
            "takes [('pixels', 'tensor(uint8)', [None, 32, 32, 3])]: the file belongs to another signature or model.",
        ),
        (
            lambda version: (
                without_int8_hashes(version),
                (version / "onnx" / "predict_pixels.int8.onnx").write_bytes(
                    (version / "onnx" / "predict_pixels.int8.onnx").read_bytes()[:5000]
                ),
            ),
            f"Could not load the ONNX model {INT8} (missing, empty, truncated or corrupt: export it again): ",
        ),
        (
            lambda version: (version / "metadata.json").write_text(
                json.dumps(
                    {
                        **json.loads((version / "metadata.json").read_text()),
                        "onnx": {
                            **json.loads((version / "metadata.json").read_text())["onnx"],
                            "quantized": {},
                        },
                    }
                )
            ),
            "{version}/metadata.json does not describe the int8 ONNX models (KeyError: 'int8'): export the model "
            "again with --format onnx (or all) --quantize int8 --calibration-images ....",
        ),
        (
            lambda version: (version / "metadata.json").write_text(
                json.dumps({**json.loads((version / "metadata.json").read_text()), "class_names": list("abcdefghij")})
            ),
            f"{{version}}/metadata.json is not the one exported with the ONNX model {INT8} (edited, or another "
            'export\'s): it says class_names=["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"] where the model has ',
        ),
        (
            lambda version: with_int8_settings(version, None),
            "The int8 ONNX models of {version} were quantized with other settings than {settings} (8-bit weights "
            "with unsigned activations overflow on processors without VNNI): export the model again with "
            "`keras-preact export ... --format onnx --quantize int8 --calibration-images ...`.",
        ),
        (
            lambda version: with_int8_settings(
                version, dict(contract.ONNX_INT8_SETTINGS, weights="int8, per output channel")
            ),
            "The int8 ONNX models of {version} were quantized with other settings than",
        ),
        (
            without_input_ranges,
            "The int8 ONNX models of {version} record no range of the inputs they quantize (exported before "
            "serve checked them): export the model again with `keras-preact export ... --format onnx "
            "--quantize int8 --calibration-images ...`.",
        ),
    ],
    ids=[
        "altered",
        "swapped, no hashes",
        "truncated, no hashes",
        "not in metadata.json",
        "class names edited",
        "exported before the settings",
        "8-bit weights",
        "exported before the input ranges",
    ],
)
def test_the_int8_files_are_checked_at_start(quantized, tmp_path, change, message):
    directory = damaged_copy(quantized, tmp_path, change)
    with pytest.raises(ValueError) as error:
        ModelServer(str(directory), runtime="onnxruntime", precision="int8")
    version = directory / os.path.basename(quantized)
    expected = message.format(version=version, settings=contract.ONNX_INT8_SETTINGS)
    assert str(error.value).startswith(expected), str(error.value)
    assert "\n" not in str(error.value)


def test_a_precision_the_runtime_or_the_folder_lacks_is_refused(quantized, tmp_path):
    directory = os.path.dirname(quantized)
    with pytest.raises(
        ValueError,
        match=r"^The tensorflow runtime serves float32 models \(int8 ONNX models are served by --runtime "
        r"onnxruntime\)\. Received: precision='int8'$",
    ):
        ModelServer(directory, runtime="tensorflow", precision="int8")
    with pytest.raises(
        ValueError, match=r"^precision must be one of \['float32', 'int8'\]\. Received: precision='float16'$"
    ):
        ModelServer(directory, runtime="onnxruntime", precision="float16")
    plain = tmp_path / "plain"
    export.export_saved_model(
        keras_preact.ResNet20(input_shape=CIFAR.shape, classes=10),
        str(plain),
        CIFAR_CLASSES,
        CIFAR,
        formats=("onnx",),
        verbose=False,
    )
    with pytest.raises(
        FileNotFoundError,
        match=r"^No complete version folder with int8 ONNX models \(<directory>/<number>/onnx/"
        r"predict_normalized\.int8\.onnx and metadata\.json\) in .*plain\. Export one with `keras-preact export --format onnx \(or all\) --quantize int8 "
        r"--calibration-images \.\.\.`\.",
    ):
        ModelServer(str(plain), runtime="onnxruntime", precision="int8")


def write_image(path, shape):
    Image.fromarray(random_pixels(1, CIFAR)[0][: shape[0], : shape[1], : shape[2]].squeeze()).save(path)
    return str(path)


def test_calibration_images_are_checked(tmp_path):
    good = write_image(tmp_path / "good.png", (32, 32, 3))
    np.testing.assert_array_equal(
        calibration.calibration_pixels([good, str(tmp_path)], CIFAR.shape),
        np.stack([np.array(Image.open(good))] * 2),  # the file, then the folder's one image
    )
    small = write_image(tmp_path / "small.png", (16, 16, 3))
    grey = write_image(tmp_path / "grey.png", (32, 32, 1))
    (tmp_path / "text.jpg").write_text("not an image")
    cases = [
        (None, r"^int8 export needs calibration images: name a few hundred training images"),
        ([], r"^int8 export needs calibration images: .* Received: no images$"),
        (
            [small],
            r"^Calibration images must be 32x32 with 3 channels, .* Received: .*small\.png, 16x16 with 3 channels$",
        ),
        ([grey], r"^Calibration images must be 32x32 with 3 channels, .* Received: .*grey\.png, 32x32 with 1 channel$"),
        ([str(tmp_path / "text.jpg")], r"^The calibration image .*text\.jpg is not a JPEG, PNG, GIF or BMP image"),
        (
            np.zeros((4, 32, 32, 1), np.uint8),
            r"^Calibration pixels must be an array \[count, 32, 32, 3\] .* Received: an array of shape \(4, 32, 32, 1\)$",
        ),
        (
            np.full((4, 32, 32, 3), 300.0),
            r"^Calibration pixels must be 0-255\. Received: values from 300\.0 to 300\.0$",
        ),
    ]
    for given, message in cases:
        with pytest.raises(ValueError, match=message):
            calibration.calibration_pixels(given, CIFAR.shape)
    with pytest.raises(FileNotFoundError, match=r"^No calibration image or folder '.*nowhere'\.$"):
        calibration.calibration_pixels([str(tmp_path / "nowhere")], CIFAR.shape)


@pytest.mark.parametrize(
    "formats, precisions, message",
    [
        (
            ("onnx",),
            ("float32", "float16"),
            r"^No format exported offers float16 \(onnx: float32, int8\); float16 is written for litert \(--format litert or all\)\. Received: precision 'float16'$",
        ),
        (
            ("saved_model",),
            ("float32", "int8"),
            r"^No format exported offers int8 \(saved_model: float32\); int8 is written for onnx and litert \(--format onnx or all\)\. Received: precision 'int8'$",
        ),
        (
            ("litert",),
            ("int4",),
            r"^precisions must be some of \['float16', 'float32', 'int8'\]\. Received: precisions=\('int4',\)$",
        ),
        (("litert",), ("float32", "int8"), r"^int8 export needs calibration images"),
        (
            ("tflite",),
            ("float32",),
            r"^formats must name some of \['saved_model', 'onnx', 'litert', 'kerashub'\]\. Received: formats=\('tflite',\)$",
        ),
    ],
    ids=["float16 to ONNX", "int8 to a SavedModel", "unknown precision", "int8 without calibration", "unknown format"],
)
def test_a_precision_no_format_offers_is_refused_before_anything_is_written(tmp_path, formats, precisions, message):
    network = keras_preact.ResNet20(input_shape=CIFAR.shape, classes=10)
    with pytest.raises(ValueError, match=message):
        export.export_saved_model(
            network,
            str(tmp_path / "model"),
            CIFAR_CLASSES,
            CIFAR,
            formats=formats,
            precisions=precisions,
            verbose=False,
        )
    assert not os.path.exists(tmp_path / "model")


@pytest.mark.parametrize(
    "arguments, message",
    [
        (
            ["--format", "litert", "--quantize", "int8"],
            "error: int8 export needs calibration images: name a few hundred",
        ),
        (
            ["--format", "litert", "--calibration-images", "x.jpg"],
            "error: --calibration-images calibrate int8 only: add --quantize int8. Received: --quantize (none)",
        ),
        (
            ["--format", "onnx", "--quantize", "float16"],
            "error: No format exported offers float16 (onnx: float32, int8)",
        ),
    ],
)
def test_the_export_command_says_what_is_wrong_in_one_line(tmp_path, capsys, arguments, message):
    assert (
        cli.main(["export", "--model", "resnet20", "--weights", "cifar10", "--output", str(tmp_path), *arguments]) == 2
    )
    error = capsys.readouterr().err
    assert message in error and "Traceback" not in error
    assert os.listdir(tmp_path) == []
