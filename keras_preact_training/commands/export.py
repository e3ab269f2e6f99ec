"""`keras-preact export`: a finished run or shipped weights as a TF Serving version folder
(SavedModel, ONNX, LiteRT), reloaded and checked."""

from .. import export
from ..data import cifar10_folder
from .arguments import model_name

HELP = "export a trained run or shipped weights as a SavedModel for TF Serving, then check it"
DESCRIPTION = (
    "Export the model of a finished training run (--run-dir), or a network with keras-preact's "
    "shipped weights (--model, --weights cifar10 or cifar100), to <output>/<name>/<version>/ with the signatures "
    "serving_default (encoded images), predict_pixels (uint8) and predict_normalized (float), and "
    "metadata.json; reload it and print its classes for --images, or else for the first test image of the "
    "run's data."
)
TENSORFLOW = "always"
BACKENDS = ("tensorflow",)


def add_arguments(parser):
    parser.add_argument("--run-dir", help="a finished run of `keras-preact train`")
    parser.add_argument("--model", help="a network with shipped weights, e.g. resnet20 (with --weights)")
    parser.add_argument("--weights", choices=list(cifar10_folder.FOLDERS), help="the shipped weights of --model")
    parser.add_argument(
        "--images",
        nargs="+",
        metavar="IMAGE",
        help="image files (JPEG, PNG, GIF, BMP) to classify with the reloaded SavedModel",
    )
    parser.add_argument(
        "--output",
        default=export.DEFAULT_DIRECTORY,
        help=f"folder of exported models (default: {export.DEFAULT_DIRECTORY})",
    )
    parser.add_argument("--name", help="model name, the folder TF Serving serves (default: <dataset>_<model>)")
    parser.add_argument("--version", type=int, help="version number (default: one more than the highest there)")
    parser.add_argument(
        "--top-k",
        type=int,
        default=export.DEFAULT_TOP_K,
        help=f"classes each prediction lists (default: {export.DEFAULT_TOP_K})",
    )
    parser.add_argument(
        "--format",
        choices=export.format_names(),
        default=export.format_names()[0],
        help="saved_model (default), onnx (the pixel signatures as ONNX models in <version>/"
        "onnx/, checked with onnxruntime; needs keras-preact[onnx]), litert (predict_pixels as "
        "LiteRT models in <version>/litert/, checked with LiteRT's interpreter; needs "
        "keras-preact[litert]), all (the three), or kerashub (a KerasHub classifier preset in "
        "<version>/kerashub/, loaded back with from_preset; needs keras-preact[hub])",
    )
    parser.add_argument(
        "--quantize",
        nargs="+",
        choices=export.quantized_precisions(),
        default=[],
        metavar="PRECISION",
        help="also write these precisions beside float32, in the formats that offer them: float16 "
        "(LiteRT) and int8 (ONNX and LiteRT; needs --calibration-images)",
    )
    parser.add_argument(
        "--calibration-images",
        nargs="+",
        metavar="IMAGE",
        help="images that calibrate int8: a few hundred training images of the network's size "
        "(files, or folders read recursively)",
    )
    parser.add_argument(
        "--no-fold",
        dest="fold",
        action="store_false",
        help="export the network as it trains, with BatchNorm after each convolution "
        "(default: BatchNorm folded into the convolution before it, the same outputs)",
    )


def check(arguments):
    """The network, checked before TensorFlow loads."""
    if arguments.model is not None:
        arguments.model = model_name(arguments.model)


def run(arguments):
    """Exports a run or shipped weights, reloads the SavedModel and prints its classes of images."""
    from ..export import contract, saved_model, sources, versions

    if (arguments.run_dir is None) == (arguments.model is None) or (arguments.model is None) != (
        arguments.weights is None
    ):
        raise ValueError(
            "export needs either --run-dir (a finished run) or --model with --weights (shipped "
            f"weights). Received: --run-dir {arguments.run_dir}, --model {arguments.model}, "
            f"--weights {arguments.weights}"
        )
    if arguments.name is not None:
        versions.checked_name(arguments.name)
    images = saved_model.read_image_files(arguments.images or [])
    formats = export.chosen(arguments.format)
    if "int8" not in arguments.quantize and arguments.calibration_images:
        raise ValueError(
            "--calibration-images calibrate int8 only: add --quantize int8. Received: --quantize "
            f"{' '.join(arguments.quantize) or '(none)'}"
        )
    quantized = dict(precisions=("float32", *arguments.quantize), calibration_images=arguments.calibration_images)
    options = dict(formats=formats, fold_batch_norms=arguments.fold, **quantized)
    if arguments.run_dir is not None:
        path = sources.export_run(
            arguments.run_dir, arguments.output, arguments.name, arguments.version, arguments.top_k, **options
        )
    else:
        path = sources.export_shipped(
            arguments.model,
            arguments.weights,
            arguments.output,
            arguments.name,
            arguments.version,
            arguments.top_k,
            **options,
        )
    metadata = contract.read_metadata(path)
    for name in formats:
        if name != "saved_model":
            written = ", ".join(export.FORMATS[name].written(metadata))
            checked = export.FORMATS[name].checked_by
            print(
                f"{export.FORMATS[name].files_name} (checked with {checked} against the network): {written} in {path}"
            )
    if "saved_model" in formats:
        print_classes(arguments, path, images)
    return 0


def print_classes(arguments, path, images):
    """The reloaded SavedModel's classes of `images` (--images), or of the run's first test image."""
    from ..export import saved_model, sources

    if arguments.images:
        width = max(len(image) for image in arguments.images)
        print("The reloaded SavedModel's classes:")
        for image, ranked in zip(arguments.images, saved_model.classify(path, images)):
            print(f"  {image:<{width}}  " + ", ".join(f"{name} {score:.1%}" for name, score in ranked[:3]))
    elif arguments.run_dir is not None:
        image, label = sources.example_image(arguments.run_dir)
        outputs = saved_model.predict_encoded(path, [image])
        ranked = ", ".join(
            f"{name.decode()} {score:.1%}" for name, score in zip(outputs["classes"][0], outputs["scores"][0])
        )
        print(f"The reloaded SavedModel on the first test image (a {label!r}, {len(image)} bytes encoded): {ranked}.")
