"""The ONNX format: the image-array signatures (`contract.ONNX_MODELS`) as ONNX models under
`<version>/onnx/`, written by Keras' ONNX export (tf2onnx) and checked with onnxruntime against
the network; and on request int8 models beside them, with onnxruntime's static quantization
as `contract.ONNX_INT8_SETTINGS` says (the QDQ format: quantize and dequantize pairs around
each operation, which onnxruntime fuses into integer kernels; weights int8 per output channel
in 7 bits, activations uint8, with scales calibrated on images the user names,
`export.calibration`; the contract says why 7-bit weights). Each model records the
answer's facts (`contract.answer_fields`) in its metadata, which the onnxruntime server checks
against metadata.json."""

import logging
import os
import warnings

from . import Format, contract, register

# What installs ONNX export and the onnxruntime server.
EXTRA = 'pip install "keras-preact[onnx]"'
# The largest difference of logits, relative to their largest magnitude, between an
# exported ONNX model under onnxruntime and the network: float32 rounding only.
TOLERANCE = 1e-4
# Images per calibration batch fed to onnxruntime's calibrator (a memory bound only).
CALIBRATION_BATCH = 32


def require():
    """Raises an ImportError naming the extra when tf2onnx, onnx or onnxruntime is missing."""
    for module in ("onnx", "tf2onnx", "onnxruntime"):
        try:
            __import__(module)
        except ImportError:
            raise ImportError(f"ONNX export needs the onnx extra ({module} is not installed): {EXTRA}") from None


def package_versions():
    import onnx
    import onnxruntime
    import tf2onnx

    return dict(onnx=onnx.__version__, tf2onnx=tf2onnx.__version__, onnxruntime=onnxruntime.__version__)


def write(version):
    """Writes the ONNX models of `version` (an `export.versions.Version`), in float32 and in the
    other precisions it asks for; returns metadata.json's "onnx" entry."""
    import numpy as np

    onnx_files = export_onnx(version.separated, version.path, version.preprocessing, version.normalization)
    record_answer(version.path, onnx_files, version.answer)
    described = dict(
        files=onnx_files, outputs=list(contract.ONNX_OUTPUTS), sha256=contract.digests(version.path, onnx_files)
    )
    if "int8" in version.precisions["onnx"]:
        normalize = version.normalization
        int8_files = quantize(
            version.path, onnx_files, version.pixels, lambda pixels: normalize(pixels.astype(np.float32))
        )
        record_answer(version.path, int8_files, version.answer)
        described["quantized"] = dict(
            int8=dict(
                files=int8_files,
                sha256=contract.digests(version.path, int8_files),
                calibration_images=len(version.pixels),
                settings=contract.ONNX_INT8_SETTINGS,
                input_ranges=input_ranges(version.path, int8_files),
            )
        )
    return {"onnx": described}


def written(metadata):
    files = [*metadata["onnx"]["files"].values()]
    for precision in metadata["onnx"].get("quantized", {}):
        files += contract.onnx_models(metadata, precision)["files"].values()
    return files


register(
    Format(
        name="onnx",
        title="ONNX",
        files_name="ONNX models",
        precisions=("float32", "int8"),
        write=write,
        needed=lambda precision: [contract.onnx_file(name, precision) for name in sorted(contract.ONNX_MODELS)],
        written=written,
        runtime="onnxruntime",
        require=require,
        package_versions=package_versions,
        checked_by="onnxruntime",
    )
)


def export_onnx(network, path, preprocessing, normalization):
    """Writes `<path>/onnx/<signature>.onnx` for the image-array signatures (`contract.ONNX_MODELS`) of
    `network` (units in loops separated: `export.versions.Version.separated`) with Keras' ONNX
    export (tf2onnx), then runs each with onnxruntime on random pixels against the network: a
    model whose logits differ by more than TOLERANCE is an error.

    Returns:
        {signature: file path relative to `path`}.
    """
    import keras
    import numpy as np
    import onnxruntime

    from .networks import SignatureModel, input_spec, normalization_constants

    mean, variance = normalization_constants(normalization)
    pixels = np.random.default_rng(0).integers(0, 256, size=(4, *preprocessing.shape)).astype(np.uint8)
    os.makedirs(os.path.join(path, contract.ONNX_DIRECTORY), exist_ok=True)
    files = {}
    for signature in (contract.SIGNATURES[name] for name in contract.ONNX_MODELS):
        pixel_input = signature.dtype == "uint8"  # normalised inside the graph
        model = SignatureModel(network, mean, variance) if pixel_input else SignatureModel(network)
        inputs = pixels if pixel_input else keras.ops.convert_to_numpy(normalization(pixels.astype(np.float32)))
        expected = keras.ops.convert_to_numpy(model(inputs)["logits"])  # Keras exports called models only
        files[signature.name] = contract.onnx_file(signature.name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # tf2onnx's use of np.object, patched by Keras
            model.export(
                os.path.join(path, files[signature.name]),
                format="onnx",
                verbose=False,
                input_signature=[input_spec(signature, preprocessing.shape)],
            )
        session = onnxruntime.InferenceSession(
            os.path.join(path, files[signature.name]), providers=["CPUExecutionProvider"]
        )
        logits = session.run(["logits"], {signature.key: inputs.astype(signature.dtype)})[0]
        difference = np.abs(logits - expected).max() / max(np.abs(expected).max(), 1e-6)
        if not difference <= TOLERANCE:
            raise ValueError(
                f"The ONNX model {files[signature.name]} computes other logits than the network under "
                f"onnxruntime on random pixels: relative difference {difference:.2g}, where float32 "
                f"rounding stays under {TOLERANCE:g} (an untrained deep network can amplify "
                "rounding that much; a trained one does not). Export with --format saved_model."
            )
    return files


def record_answer(path, relative_files, answer):
    """Records `answer` (`contract.answer_fields`) under `contract.ONNX_ANSWER_KEY` in the
    metadata_props of each ONNX model in `relative_files` ({signature: path relative to `path`})."""
    import onnx

    for file in relative_files.values():
        model = onnx.load(os.path.join(path, file))
        properties = {entry.key: entry.value for entry in model.metadata_props}
        onnx.helper.set_model_props(model, {**properties, contract.ONNX_ANSWER_KEY: answer})
        onnx.save(model, os.path.join(path, file))


# ONNX operators that move values without changing them, between a model's input and its first
# QuantizeLinear.
VALUE_PRESERVING_OPS = ("Transpose", "Reshape", "Identity", "Squeeze", "Unsqueeze")


def input_ranges(path, files):
    """{signature: [lowest, highest]} of the float inputs the int8 models of `files` quantize
    without saturating: ((0 - zero point) x scale, (255 - zero point) x scale) of the
    QuantizeLinear that reads the model's input (`serve` refuses values outside it)."""
    import onnx
    from onnx import numpy_helper

    ranges = {}
    for name, file in files.items():
        if contract.SIGNATURES[name].dtype != "float32":
            continue
        graph = onnx.load(os.path.join(path, file)).graph
        constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
        tensor = graph.input[0].name
        while True:  # through the layout changes tf2onnx puts first (NHWC to NCHW)
            readers = [node for node in graph.node if tensor in node.input]
            quantizers = [node for node in readers if node.op_type == "QuantizeLinear"]
            if quantizers:
                scale, zero_point = float(constants[quantizers[0].input[1]]), int(constants[quantizers[0].input[2]])
                ranges[name] = [(0 - zero_point) * scale, (255 - zero_point) * scale]
                break
            if len(readers) != 1 or readers[0].op_type not in VALUE_PRESERVING_OPS:
                raise ValueError(f"The int8 ONNX model {file} quantizes its input nowhere this export can find.")
            tensor = readers[0].output[0]
    return ranges


def quantize(path, files, pixels, normalize):
    """Writes the int8 model of each float32 ONNX model in `files` ({signature: path relative
    to `path`}), calibrated on `pixels` (uint8 [count, H, W, C]): the pixels themselves for
    `predict_pixels`, `normalize(pixels)` for `predict_normalized`.

    Returns:
        {signature: int8 file path relative to `path`}.
    """
    import numpy as np
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Batches(CalibrationDataReader):
        def __init__(self, key, images):
            self.batches = iter(
                {key: images[start : start + CALIBRATION_BATCH]} for start in range(0, len(images), CALIBRATION_BATCH)
            )

        def get_next(self):
            return next(self.batches, None)

    quantized = {}
    for name, file in files.items():
        signature = contract.SIGNATURES[name]
        images = pixels if signature.dtype == "uint8" else np.asarray(normalize(pixels), dtype=np.float32)
        quantized[name] = contract.onnx_file(name, "int8")
        prepared = os.path.join(path, quantized[name] + ".prepared")
        root = logging.getLogger()
        level = root.level
        # The quantizer warns through the root logger of every BatchNorm scale (a vector) it
        # cannot quantize per channel: those are quantized per tensor, as they should be.
        root.setLevel(logging.ERROR)
        try:
            # Graph optimisation and ONNX shape inference first, as onnxruntime recommends (its
            # symbolic shape inference cannot follow tf2onnx's batch dimension, and is not needed).
            quant_pre_process(os.path.join(path, file), prepared, skip_symbolic_shape=True)
            quantize_static(
                prepared,
                os.path.join(path, quantized[name]),
                Batches(signature.key, images),
                quant_format=QuantFormat.QDQ,
                per_channel=True,
                activation_type=QuantType.QUInt8,  # contract.ONNX_INT8_SETTINGS
                weight_type=QuantType.QInt8,
                reduce_range=True,
            )
        finally:
            root.setLevel(level)
            if os.path.exists(prepared):
                os.remove(prepared)
    return quantized
