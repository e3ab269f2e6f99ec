"""Damaged JPEGs on both serving runtimes' decoders, and what the check that tells them apart costs.

    python bench/damaged_jpegs.py
    python bench/damaged_jpegs.py --flips 100 --size 1024

A 19 x 23 JPEG of noise, baseline and progressive (as the serving tests' catalogue makes them),
cut short at every 7th byte (with and without an end marker after the cut) and with 1-3 random
bytes flipped `--flips` times each. Each file is sorted by the serving check's verdict
(`image_formats.check`: accepted, refused as damaged, refused as an incomplete progressive JPEG),
then decoded by TensorFlow as the SavedModel does and by the onnxruntime runtime's
`images.decode`. Prints, for each verdict, how many files each decoder decoded, and of those both
decoded how many got other pixels. Then the check's seconds against a full decode for a clean JPEG
of `--size` pixels square (`image_decoding.images`), and the machine.
"""

import argparse
import collections
import io
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from harness import processor
from image_decoding import images, median_seconds


def damaged(flips, seed=0):
    """{name: bytes}: the baseline and progressive JPEGs cut short and with bytes flipped."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (19, 23, 3), np.uint8)
    files = {}
    for kind, options in (("baseline", {}), ("progressive", {"progressive": True})):
        stream = io.BytesIO()
        Image.fromarray(pixels).save(stream, "JPEG", quality=90, **options)
        whole = stream.getvalue()
        for cut in range(100, len(whole) - 2, 7):
            files[f"{kind} cut at {cut}"] = whole[:cut]
            files[f"{kind} cut at {cut}, then its end marker"] = whole[:cut] + b"\xff\xd9"
        for flip in range(flips):
            data = bytearray(whole)
            for position in rng.integers(len(whole) // 4, len(whole) - 2, rng.integers(1, 4)):
                data[position] ^= int(rng.integers(1, 256))
            files[f"{kind} flipped {flip}"] = bytes(data)
    return files


def outcomes(files):
    """{(the check's verdict, TensorFlow decoded, simplejpeg decoded, other pixels): count}."""
    import numpy as np
    import tensorflow as tf
    from PIL import Image

    from keras_preact_training.data import images as numpy_images
    from keras_preact_training.serving import image_formats

    counts = collections.Counter()
    for encoded in files.values():
        try:
            with Image.open(io.BytesIO(encoded)) as image:
                mode = image.mode
        except (OSError, SyntaxError, ValueError):
            mode = "RGB"
        try:
            image_formats.check(encoded, "JPEG", mode, 3)
            kind = "accepted"
        except ValueError as refusal:
            kind = f"refused: {str(refusal).split(':')[0]}"
        try:
            tensorflow = tf.io.decode_jpeg(encoded, channels=3, dct_method="INTEGER_ACCURATE").numpy()
        except tf.errors.InvalidArgumentError:
            tensorflow = None
        try:
            simplejpeg = numpy_images.decode(encoded, 3)
        except ValueError:
            simplejpeg = None
        both = tensorflow is not None and simplejpeg is not None
        counts[
            (kind, tensorflow is not None, simplejpeg is not None, both and not np.array_equal(tensorflow, simplejpeg))
        ] += 1
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flips", type=int, default=600)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    arguments = parser.parse_args()

    from keras_preact_training.data import images as numpy_images
    from keras_preact_training.serving import image_formats

    files = damaged(arguments.flips)
    counts = outcomes(files)
    print(f"{len(files)} damaged JPEGs; machine: {processor()}")
    print("| the check | files | TensorFlow decodes | simplejpeg decodes | both, other pixels |")
    print("|---|---|---|---|---|")
    for kind in sorted({kind for kind, *_ in counts}):
        rows = {key: count for key, count in counts.items() if key[0] == kind}
        total = sum(rows.values())
        tensorflow = sum(count for key, count in rows.items() if key[1])
        simplejpeg = sum(count for key, count in rows.items() if key[2])
        other = sum(count for key, count in rows.items() if key[3])
        print(f"| {kind} | {total} | {tensorflow} | {simplejpeg} | {other} |")

    encoded = images(arguments.size, count=1)["JPEG"][0]
    check = median_seconds(lambda: image_formats.check(encoded, "JPEG", "RGB", 3), arguments.repeats)
    decode = median_seconds(lambda: numpy_images.decode(encoded, 3), arguments.repeats)
    print(
        f"{arguments.size} x {arguments.size} JPEG ({len(encoded):,} bytes): the check {check:.4f} s, "
        f"simplejpeg's full decode {decode:.4f} s ({check / decode:.2f} of it)"
    )


if __name__ == "__main__":
    main()
