"""One answer per image: every format, bit depth and mode that Pillow or TensorFlow writes (and
a few that only other encoders write, built here byte by byte), sent to both runtimes. Each is
answered by both with the same classes and probabilities within 1e-4, or refused by both
with the same status and message."""

import io
import json
import re
import struct
import zlib

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import keras_preact
from keras_preact_training import export
from keras_preact_training.serving.model import RUNTIMES, ModelServer
from keras_preact_training.serving.protocol import UNDECODABLE, BadRequest
from tests.test_export import calibrated, random_pixels
from tests.test_serving import b64, export_resnet20
from tests.test_serving_onnx import PROBABILITY_TOLERANCE

pytestmark = pytest.mark.tensorflow

# The catalogue's images are small and of odd sizes: every one is resized.
HEIGHT, WIDTH = 19, 23


def saved(image, image_format, **options):
    stream = io.BytesIO()
    image.save(stream, format=image_format, **options)
    return stream.getvalue()


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_chunks(encoded):
    """[(kind, data)] of a PNG file."""
    chunks, position = [], 8
    while position < len(encoded):
        (length,) = struct.unpack(">I", encoded[position : position + 4])
        chunks.append((encoded[position + 4 : position + 8], encoded[position + 8 : position + 8 + length]))
        position += 12 + length
    return chunks


JPEG_COMMENT = b"\xff\xfe\x00\x04ab"
GIF_COMMENT = b"\x21\xfe\x02ab\x00"
# Where a GIF's blocks start, after its header, screen descriptor and 16-colour table.
GIF_HEAD = 13 + 3 * 16


def with_chunks(png, chunks):
    """`png` with `chunks` (encoded) after its IHDR chunk."""
    after_header = 8 + 12 + 13
    return png[:after_header] + b"".join(chunks) + png[after_header:]


def interlaced_png(pixels):
    """uint8 pixels [height, width, 3] as an Adam7-interlaced PNG (Pillow writes none)."""
    height, width = pixels.shape[:2]
    passes = ((0, 0, 8, 8), (0, 4, 8, 8), (4, 0, 8, 4), (0, 2, 4, 4), (2, 0, 4, 2), (0, 1, 2, 2), (1, 0, 2, 1))
    raw = b""
    for top, left, row_step, column_step in passes:
        reduced = pixels[top::row_step, left::column_step]
        if reduced.size:
            raw += b"".join(b"\0" + row.tobytes() for row in reduced)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 1)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", header)
        + png_chunk(b"IDAT", zlib.compress(raw))
        + png_chunk(b"IEND", b"")
    )


def bmp(pixel_data, width, height, bits, compression=0, palette=b"", header_size=40):
    """A BMP file around `pixel_data` (rows as the header says: bottom-up for a positive
    height); `palette` as BGRA entries."""
    colours = len(palette) // 4
    info = struct.pack(
        "<IiiHHIIiiII", header_size, width, height, 1, bits, compression, len(pixel_data), 2835, 2835, colours, 0
    )
    info += b"\0" * (header_size - len(info))
    offset = 14 + len(info) + len(palette)
    return b"BM" + struct.pack("<IHHI", offset + len(pixel_data), 0, 0, offset) + info + palette + pixel_data


def rle8_bmp(indices, palette):
    """8-bit palette indices [height, width] as an RLE8-compressed BMP: each row as runs."""
    data = b""
    for row in indices[::-1]:
        start = 0
        while start < len(row):
            end = start
            while end < len(row) and row[end] == row[start] and end - start < 255:
                end += 1
            data += bytes([end - start, row[start]])
            start = end
        data += b"\0\0"
    data += b"\0\1"
    return bmp(data, indices.shape[1], indices.shape[0], 8, compression=1, palette=palette)


def rle4_bmp(indices, palette):
    """4-bit palette indices [height, width] as an RLE4-compressed BMP: runs of two pixels."""
    data = b""
    for row in indices[::-1]:
        for start in range(0, len(row), 2):
            pair = row[start : start + 2]
            data += bytes([len(pair), (pair[0] << 4) | (pair[-1] if len(pair) == 2 else 0)])
        data += b"\0\0"
    data += b"\0\1"
    return bmp(data, indices.shape[1], indices.shape[0], 4, compression=2, palette=palette)


def rgb555_bmp(pixels):
    """uint8 RGB pixels as a 16-bit (5-5-5) BMP, bottom-up, rows padded to 4 bytes."""
    height, width = pixels.shape[:2]
    five = (pixels >> 3).astype(np.uint16)
    words = (five[..., 0] << 10) | (five[..., 1] << 5) | five[..., 2]
    stride = (width * 2 + 3) // 4 * 4
    rows = [row.astype("<u2").tobytes().ljust(stride, b"\0") for row in words[::-1]]
    return bmp(b"".join(rows), width, height, 16)


def top_down_bmp(pixels):
    """uint8 RGB pixels as a 24-bit BMP stored top-down (a negative height)."""
    height, width = pixels.shape[:2]
    stride = (width * 3 + 3) // 4 * 4
    rows = [row[:, ::-1].tobytes().ljust(stride, b"\0") for row in pixels]
    return bmp(b"".join(rows), width, -height, 24)


def taller_jpeg(jpeg, rows):
    """`jpeg` with `rows` more rows declared in its baseline frame header than its data hold."""
    frame = jpeg.index(b"\xff\xc0") + 5  # the marker, its length, the sample precision
    height = int.from_bytes(jpeg[frame : frame + 2], "big")
    return jpeg[:frame] + (height + rows).to_bytes(2, "big") + jpeg[frame + 2 :]


def gif_on_screen(gif, screen, offset):
    """`gif` with its screen (width, height) and its first frame's offset (left, top) rewritten."""
    edited = bytearray(gif)
    edited[6:10] = struct.pack("<HH", *screen)
    position = GIF_HEAD if gif[10] & 0x80 else 13
    while edited[position] == 0x21:  # extensions, each a chain of sub-blocks
        position += 2
        while edited[position]:
            position += edited[position] + 1
        position += 1
    edited[position + 1 : position + 5] = struct.pack("<HH", *offset)
    return bytes(edited)


def ycck_jpeg(cmyk_jpeg):
    """A CMYK JPEG whose Adobe segment says YCCK (transform 2): libjpeg converts it to CMYK."""
    adobe = cmyk_jpeg.index(b"Adobe")
    return cmyk_jpeg[: adobe + 11] + b"\x02" + cmyk_jpeg[adobe + 12 :]


def catalogue(seed=0):
    """{name: encoded bytes}: the formats and modes a client may send, and damaged ones."""
    rng = np.random.default_rng(seed)
    rgb = rng.integers(0, 256, (HEIGHT, WIDTH, 3), np.uint8)
    alpha = rng.integers(0, 256, (HEIGHT, WIDTH, 1), np.uint8)
    grey = rng.integers(0, 256, (HEIGHT, WIDTH), np.uint8)
    colour = Image.fromarray(rgb)
    palette = colour.quantize(16)
    palette_entries = bytes(
        value
        for red, green, blue in np.asarray(palette.getpalette()[:48]).reshape(16, 3)
        for value in (blue, green, red, 0)
    )
    images = {
        # JPEG: Pillow's modes and options, TensorFlow's encoder's options.
        "JPEG RGB": saved(colour, "JPEG", quality=75),
        "JPEG RGB 4:4:4": saved(colour, "JPEG", quality=95, subsampling=0),
        "JPEG RGB 4:2:2": saved(colour, "JPEG", subsampling=1),
        "JPEG progressive": saved(colour, "JPEG", progressive=True),
        "JPEG optimized": saved(colour, "JPEG", optimize=True),
        "JPEG grey": saved(Image.fromarray(grey), "JPEG"),
        "JPEG CMYK": saved(colour.convert("CMYK"), "JPEG"),
        "JPEG YCCK": ycck_jpeg(saved(colour.convert("CMYK"), "JPEG")),
        "JPEG with EXIF orientation": saved(
            colour, "JPEG", exif=b"Exif\0\0MM\0*\0\0\0\x08\0\x01\x01\x12\0\x03\0\0\0\x01\0\x06\0\0\0\0\0\0"
        ),
        "JPEG MPO (two frames)": saved(colour, "MPO", save_all=True, append_images=[Image.fromarray(rgb[::-1])]),
        "JPEG TensorFlow progressive": tf.io.encode_jpeg(rgb, progressive=True).numpy(),
        "JPEG TensorFlow grey": tf.io.encode_jpeg(grey[..., None]).numpy(),
        "JPEG TensorFlow 4:4:4": tf.io.encode_jpeg(rgb, chroma_downsampling=False, quality=100).numpy(),
        # PNG: every colour type and bit depth.
        "PNG RGB": saved(colour, "PNG"),
        "PNG RGBA": saved(Image.fromarray(np.concatenate([rgb, alpha], -1)), "PNG"),
        "PNG grey": saved(Image.fromarray(grey), "PNG"),
        "PNG grey and alpha": saved(Image.fromarray(np.stack([grey, alpha[..., 0]], -1), "LA"), "PNG"),
        "PNG 1-bit": saved(Image.fromarray(grey).convert("1"), "PNG"),
        "PNG palette 8-bit": saved(palette, "PNG"),
        "PNG palette 4-bit": saved(palette, "PNG", bits=4),
        "PNG palette 2-bit": saved(colour.quantize(4), "PNG", bits=2),
        "PNG palette with transparency": saved(palette, "PNG", transparency=0),
        "PNG RGB with transparency": saved(colour, "PNG", transparency=tuple(int(value) for value in rgb[0, 0])),
        "PNG 16-bit grey": tf.io.encode_png(rng.integers(0, 65536, (HEIGHT, WIDTH, 1), np.uint16)).numpy(),
        "PNG 16-bit grey and alpha": tf.io.encode_png(rng.integers(0, 65536, (HEIGHT, WIDTH, 2), np.uint16)).numpy(),
        "PNG 16-bit RGB": tf.io.encode_png(rng.integers(0, 65536, (HEIGHT, WIDTH, 3), np.uint16)).numpy(),
        "PNG 16-bit RGBA": tf.io.encode_png(rng.integers(0, 65536, (HEIGHT, WIDTH, 4), np.uint16)).numpy(),
        "PNG interlaced": interlaced_png(rgb),
        "PNG animated (APNG)": saved(colour, "PNG", save_all=True, append_images=[Image.fromarray(rgb[::-1])]),
        # GIF and BMP.
        "GIF": saved(palette, "GIF"),
        "GIF grey": saved(Image.fromarray(grey), "GIF"),
        "GIF with transparency": saved(palette, "GIF", transparency=0),
        "GIF interlaced": saved(palette, "GIF", interlace=True),
        "GIF animated": saved(palette, "GIF", save_all=True, append_images=[Image.fromarray(rgb[::-1]).quantize(16)]),
        "GIF frame larger than its screen": gif_on_screen(saved(palette, "GIF"), (10, 10), (0, 0)),
        "GIF frame at an offset": gif_on_screen(
            saved(Image.fromarray(rgb[:10, :10]).quantize(16), "GIF"), (WIDTH, HEIGHT), (5, 4)
        ),
        "GIF frame past its screen": gif_on_screen(
            saved(Image.fromarray(rgb[:10, :10]).quantize(16), "GIF"), (12, 12), (6, 6)
        ),
        "BMP RGB": saved(colour, "BMP"),
        "BMP RGBA": saved(Image.fromarray(np.concatenate([rgb, alpha], -1)), "BMP"),
        "BMP grey": saved(Image.fromarray(grey), "BMP"),
        "BMP 1-bit": saved(Image.fromarray(grey).convert("1"), "BMP"),
        "BMP palette": saved(palette, "BMP"),
        "BMP RLE8": rle8_bmp(np.asarray(palette), palette_entries + b"\0" * (256 - 16) * 4),
        "BMP RLE4": rle4_bmp(np.asarray(palette), palette_entries),
        "BMP 16-bit": rgb555_bmp(rgb),
        "BMP top-down": top_down_bmp(rgb),
    }
    jpeg, png = images["JPEG RGB"], images["PNG RGB"]
    progressive = images["JPEG progressive"]
    last_scan = progressive.rindex(b"\xff\xda")
    scans = [found.start() for found in re.finditer(b"\xff\xda", progressive)]
    chunks = png_chunks(png)
    damaged = {
        "damaged: JPEG truncated": jpeg[: len(jpeg) // 2],
        "damaged: JPEG without its end marker": jpeg[:-2],
        "damaged: JPEG cut short at its end marker": jpeg[: (jpeg.index(b"\xff\xda") + len(jpeg)) // 2] + b"\xff\xd9",
        "damaged: JPEG whose header declares more rows than its data hold": taller_jpeg(jpeg, 32),
        "damaged: progressive JPEG cut short at its end marker": progressive[: (scans[5] + scans[6]) // 2]
        + b"\xff\xd9",
        "damaged: JPEG entropy data altered": jpeg[:-40] + bytes(byte ^ 0x5A for byte in jpeg[-40:-2]) + jpeg[-2:],
        "damaged: PNG with a bad CRC": png[:-16] + bytes([png[-16] ^ 1]) + png[-15:],
        "damaged: PNG without IEND": png[:-12],
        "damaged: PNG truncated in IDAT": png[: len(png) // 2],
        "damaged: PNG header only": png[:8] + png_chunk(*chunks[0]),
        "damaged: GIF truncated": images["GIF"][: len(images["GIF"]) // 2],
        "damaged: BMP truncated": images["BMP RGB"][: len(images["BMP RGB"]) // 2],
        "damaged: zero bytes": b"",
        # libjpeg warns of these and TensorFlow decodes them: both runtimes answer.
        "JPEG with bytes before its end marker": jpeg[:-2] + b"\x12\x34" + jpeg[-2:],
        "JPEG with its last scan twice (an inconsistent progression)": progressive[:last_scan]
        + progressive[last_scan:-2] * 2
        + b"\xff\xd9",
        "JPEG with bytes after its end marker": jpeg + b"trailing",
        # Its last scan (a refinement of the finest bits) 100 times more: 110 scans.
        "JPEG of 110 scans": progressive[:last_scan] + progressive[last_scan:-2] * 101 + b"\xff\xd9",
        # Headers of many blocks besides the pixels (image_formats.MAX_HEADER_SEGMENTS, 256;
        # MAX_PNG_COMPRESSED_TEXT, 8): accepted up to the bound, refused past it.
        "JPEG with 240 comments (and its own 8 markers)": jpeg[:2] + JPEG_COMMENT * 240 + jpeg[2:],
        "JPEG with 300 comments": jpeg[:2] + JPEG_COMMENT * 300 + jpeg[2:],
        "JPEG with 1,000,000 fill bytes before a marker": jpeg[:2] + b"\xff" * 1_000_000 + jpeg[2:],
        "PNG with 8 compressed texts": with_chunks(
            png, [png_chunk(b"zTXt", b"k\0\0" + zlib.compress(b"a" * 1000))] * 8
        ),
        "PNG with 9 compressed texts": with_chunks(
            png, [png_chunk(b"zTXt", b"k\0\0" + zlib.compress(b"a" * 1000))] * 9
        ),
        "PNG with 300 texts": with_chunks(png, [png_chunk(b"tEXt", b"k\0v")] * 300),
        "GIF with 300 comments": images["GIF"][:GIF_HEAD] + GIF_COMMENT * 300 + images["GIF"][GIF_HEAD:],
        "not an image: text": b"hello, world",
        "not accepted: WebP": saved(colour, "WEBP"),
        "not accepted: TIFF": saved(colour, "TIFF"),
        "not accepted: ICO": saved(colour, "ICO"),
        "not accepted: PPM": saved(colour, "PPM"),
    }
    return images | damaged


@pytest.fixture(scope="module")
def grey_model(tmp_path_factory):
    """A calibrated 1-channel ResNet-20 of 16 x 16 images, SavedModel and ONNX: its folder."""
    grey = export.Preprocessing(16, 1, (120.0,), (60.0,))
    network = calibrated(keras_preact.ResNet20(input_shape=grey.shape, classes=3), grey, random_pixels(8, grey, 2))
    directory = tmp_path_factory.mktemp("grey") / "grey_resnet20"
    export.export_saved_model(
        network, str(directory), ["a", "b", "c"], grey, formats=("saved_model", "onnx"), verbose=False
    )
    return directory


@pytest.fixture(scope="module")
def colour_model(tmp_path_factory):
    return export_resnet20(tmp_path_factory, seed=13)[2]


def outcome(server, image):
    """The answer of `server` to one image, or the status and message of its refusal."""
    try:
        return server.predict(json.dumps({"instances": [b64(image)]}).encode())["predictions"][0]
    except BadRequest as error:
        return error.status, str(error)


# libjpeg's warning that a JPEG's data end at a marker before its image does.
HIT_MARKER = "Corrupt JPEG data: premature end of data segment"
HEADER_FLOOD = "a {kind} whose header holds more than 256 blocks or 4,194,304 bytes besides its pixels"
# What the catalogue's refused files are refused for: one reason each, given by both runtimes
# (the shared check before decoding) or, for what only a decoder finds, the same status
# from both with each decoder's reason.
REFUSED = {
    "BMP 1-bit": "a BMP of 1 bit a pixel with a palette: TensorFlow's BMP decoder reads uncompressed BMPs of 24 or 32 bits",
    "BMP palette": "a BMP of 8 bits a pixel with a palette: TensorFlow's BMP decoder reads",
    "BMP RLE8": "a BMP of 8 bits a pixel with a palette, compressed: ",
    "BMP RLE4": "a BMP of 4 bits a pixel with a palette, compressed: ",
    "BMP 16-bit": "a BMP of 16 bits a pixel: ",
    "damaged: JPEG truncated": "Truncated File Read",
    "damaged: JPEG without its end marker": "a damaged JPEG: Premature end of JPEG file",
    "damaged: JPEG cut short at its end marker": f"a damaged JPEG: {HIT_MARKER}",
    "damaged: JPEG whose header declares more rows than its data hold": f"a damaged JPEG: {HIT_MARKER}",
    "damaged: progressive JPEG cut short at its end marker": f"a damaged JPEG: {HIT_MARKER}",
    "damaged: JPEG entropy data altered": f"a damaged JPEG: {HIT_MARKER}",
    "damaged: PNG with a bad CRC": "a damaged PNG: its 'IDAT' chunk's CRC is wrong",
    "damaged: PNG without IEND": "a damaged PNG: it ends before its IEND chunk (truncated)",
    "damaged: PNG truncated in IDAT": "a damaged PNG: its 'IDAT' chunk is cut short (truncated)",
    "damaged: PNG header only": "",
    "damaged: GIF truncated": "",
    "damaged: BMP truncated": "a damaged BMP: its 19 rows need 1422 bytes, the file has 711 (truncated)",
    "damaged: zero bytes": "Unknown image file format",
    "JPEG of 110 scans": "a JPEG of 110 scans: this server decodes at most 100 (each scan of a progressive JPEG "
    "is a pass over the whole image)",
    "JPEG with 300 comments": HEADER_FLOOD.format(kind="JPEG"),
    "JPEG with 1,000,000 fill bytes before a marker": HEADER_FLOOD.format(kind="JPEG"),
    "PNG with 9 compressed texts": "a PNG of more than 8 compressed text chunks: this server inflates no more",
    "PNG with 300 texts": HEADER_FLOOD.format(kind="PNG"),
    "GIF with 300 comments": HEADER_FLOOD.format(kind="GIF"),
    "GIF frame at an offset": f"a GIF whose first frame (10 x 10 at 5, 4) leaves part of its {WIDTH} x {HEIGHT} screen "
    "bare, which the two runtimes' decoders fill differently",
    "GIF frame past its screen": "a GIF whose first frame (10 x 10 at 6, 6) leaves part of its 12 x 12 screen bare",
    "not an image: text": "Unknown image file format",
    "not accepted: WebP": "Unknown image file format",
    "not accepted: TIFF": "Unknown image file format",
    "not accepted: ICO": "Unknown image file format",
    "not accepted: PPM": "Unknown image file format",
}
# Refused for a 1-channel model only.
REFUSED_FOR_GREY = {
    "JPEG CMYK": "a CMYK JPEG for a 1-channel model: TensorFlow's JPEG decoder makes no grey of CMYK",
    "JPEG YCCK": "a CMYK JPEG for a 1-channel model: TensorFlow's JPEG decoder makes no grey of CMYK",
    "PNG 16-bit RGB": "a 16-bit colour PNG for a 1-channel model: ",
    "PNG 16-bit RGBA": "a 16-bit colour PNG for a 1-channel model: ",
}


@pytest.mark.parametrize("model", ["colour_model", "grey_model"])
def test_both_runtimes_answer_or_refuse_every_image_alike(model, request):
    """Every image of the catalogue: the same classes and probabilities within 1e-4 from the
    SavedModel on TensorFlow and the ONNX models on onnxruntime, or a 400 from both, for
    the reason REFUSED gives (the same message from both where the shared check refuses)."""
    directory = request.getfixturevalue(model)
    servers = {runtime: ModelServer(str(directory), runtime=runtime) for runtime in RUNTIMES}
    refused = REFUSED | (REFUSED_FOR_GREY if model == "grey_model" else {})
    for name, image in catalogue().items():
        tensorflow, onnxruntime = (outcome(servers[runtime], image) for runtime in RUNTIMES)
        if name not in refused:
            assert isinstance(tensorflow, dict) and isinstance(onnxruntime, dict), (name, tensorflow, onnxruntime)
            assert tensorflow["classes"] == onnxruntime["classes"], name
            np.testing.assert_allclose(
                onnxruntime["probabilities"], tensorflow["probabilities"], atol=PROBABILITY_TOLERANCE, err_msg=name
            )
            continue
        prefix = f"{UNDECODABLE}instance 0 ({len(image)} bytes): "
        for answer in (tensorflow, onnxruntime):
            assert isinstance(answer, tuple) and answer[0] == 400, (name, answer)
            assert answer[1].startswith(prefix + refused[name]), (name, answer)
        if refused[name]:
            assert tensorflow == onnxruntime, name


def test_both_runtimes_answer_or_refuse_damaged_jpegs_alike(colour_model):
    """JPEGs cut short at every 13th byte (with and without an end marker after the cut) and
    with 1-3 bytes flipped, baseline and progressive: the same status from both runtimes, and
    where both answer, the same classes and probabilities within 1e-4; most cut files and about
    half the flipped ones refused (libjpeg's complaints that the runtimes' decoders answer
    differently, `image_formats.JPEG_DECODED_THROUGH`)."""
    servers = {runtime: ModelServer(str(colour_model), runtime=runtime) for runtime in RUNTIMES}
    rng = np.random.default_rng(3)
    images = catalogue()
    damaged = {}
    for kind in ("JPEG RGB", "JPEG progressive"):
        whole = images[kind]
        for cut in range(whole.index(b"\xff\xda"), len(whole) - 2, 13):
            damaged[f"{kind} cut at {cut}"] = whole[:cut]
            damaged[f"{kind} cut at {cut}, then its end marker"] = whole[:cut] + b"\xff\xd9"
        for flip in range(40):
            data = bytearray(whole)
            for position in rng.integers(len(whole) // 4, len(whole) - 2, rng.integers(1, 4)):
                data[position] ^= int(rng.integers(1, 256))
            damaged[f"{kind} flipped {flip}"] = bytes(data)
    refused = 0
    for name, image in damaged.items():
        tensorflow, onnxruntime = (outcome(servers[runtime], image) for runtime in RUNTIMES)
        if isinstance(tensorflow, tuple) or isinstance(onnxruntime, tuple):
            assert tensorflow == onnxruntime, (name, tensorflow, onnxruntime)
            refused += 1
            continue
        assert tensorflow["classes"] == onnxruntime["classes"], name
        np.testing.assert_allclose(
            onnxruntime["probabilities"], tensorflow["probabilities"], atol=PROBABILITY_TOLERANCE, err_msg=name
        )
    assert len(damaged) // 2 < refused < len(damaged), (refused, len(damaged))
