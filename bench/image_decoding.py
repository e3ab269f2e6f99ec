"""The documented largest request's decoding, on each runtime's decoder.

    python bench/image_decoding.py
    python bench/image_decoding.py --repeats 5 --size 4096

Four photographs-like JPEGs (smooth colour fields with noise, quality 90) and PNGs of
`--size` x `--size` pixels, the most one request may hold (`requests.MAX_REQUEST_PIXELS`),
each decoded and resized to 32 x 32 as `serving_default` does: by the SavedModel's
TensorFlow decoding (`input_tensorflow.decode_encoded`), and by the onnxruntime runtime's (`images.decode`
then `images.crop`: simplejpeg for JPEG, Pillow for PNG), with Pillow's JPEG decoding beside
them (what the onnxruntime runtime used before simplejpeg). Prints the median seconds of
`--repeats` and each against TensorFlow's, and the machine.
"""

import argparse
import io
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from harness import processor


def images(size, count=4, seed=0):
    """{format: [encoded]}: `count` images of size x size, smooth fields with noise."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    encoded = {"JPEG": [], "PNG": []}
    for _ in range(count):
        coarse = rng.integers(0, 256, (size // 256, size // 256, 3), np.uint8)
        field = np.asarray(Image.fromarray(coarse).resize((size, size), Image.BILINEAR), np.int16)
        pixels = np.clip(field + rng.integers(-8, 9, field.shape), 0, 255).astype(np.uint8)
        for image_format, options in (("JPEG", dict(quality=90)), ("PNG", dict(compress_level=6))):
            stream = io.BytesIO()
            Image.fromarray(pixels).save(stream, format=image_format, **options)
            encoded[image_format].append(stream.getvalue())
    return encoded


def median_seconds(function, repeats):
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    arguments = parser.parse_args()

    import numpy as np
    import tensorflow as tf
    from PIL import Image

    from keras_preact_training.data import images as serving_images
    from keras_preact_training.data import input_tensorflow
    from keras_preact_training.export.contract import Preprocessing

    preprocessing = Preprocessing(32, 3, (0.0,) * 3, (1.0,) * 3)
    encoded = images(arguments.size)
    print(
        f"{processor()}, {os.cpu_count()} cores; TensorFlow {tf.__version__}; 4 images of {arguments.size} x {arguments.size}"
    )

    def tensorflow(batch):
        return [input_tensorflow.decode_encoded(preprocessing, tf.constant(image)).numpy() for image in batch]

    def onnxruntime(batch):
        return [serving_images.crop(serving_images.decode(image, 3), preprocessing) for image in batch]

    def pillow(batch):
        pixels = []
        for image in batch:
            with Image.open(io.BytesIO(image)) as opened:
                pixels.append(serving_images.crop(np.asarray(opened.convert("RGB")), preprocessing))
        return pixels

    for image_format, batch in encoded.items():
        megabytes = sum(map(len, batch)) / 2**20
        reference = median_seconds(lambda batch=batch: tensorflow(batch), arguments.repeats)
        rows = [("TensorFlow (the SavedModel's)", reference)]
        rows.append(
            ("onnxruntime runtime's", median_seconds(lambda batch=batch: onnxruntime(batch), arguments.repeats))
        )
        if image_format == "JPEG":
            rows.append(
                ("Pillow's JPEG decoding", median_seconds(lambda batch=batch: pillow(batch), arguments.repeats))
            )
        print(f"\n{image_format}, {megabytes:.1f} MB encoded")
        for name, seconds in rows:
            print(f"  {name:32s} {seconds:7.3f} s  {seconds / reference:5.2f}x TensorFlow")


if __name__ == "__main__":
    main()
