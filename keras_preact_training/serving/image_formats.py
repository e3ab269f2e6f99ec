"""The image files both runtimes decode alike, told from their bytes before either decodes them.

TensorFlow's decoders (the SavedModel's) and Pillow's (the onnxruntime runtime's) disagree on
some files: TensorFlow's BMP decoder reads only uncompressed 24- and 32-bit BMPs and 8-bit
ones as grey (a palette's indices taken as grey levels), libpng refuses a PNG with a bad CRC
or no IEND chunk where Pillow decodes what it can, Pillow opens a 16-bit colour PNG in 8 bits
where libpng makes its grey from the 16, TensorFlow has no grey of a CMYK JPEG, and of damaged
JPEGs (data that end before the image does, a bad table or marker) TensorFlow's libjpeg-turbo
decodes some that simplejpeg's refuses and refuses others that it decodes. Such a file is
refused here, for both runtimes, with a reason; every other accepted file gets the same pixels
from both (tests/test_serving_formats.py enumerates them). So is a JPEG of more scans than
MAX_JPEG_SCANS, which both would decode, slowly.

Before any decoder parses a file, `check_header` bounds from its raw bytes what its header may
hold (JPEG markers, PNG chunks and their compressed text, GIF extensions): Pillow's parsers
walk such blocks one by one in Python, and inflate PNG text, so that a few hundred pixels with
a header of millions of markers cost a parse thread seconds and the server gigabytes.
"""

import io
import re
import struct
import zlib

import simplejpeg
from PIL import Image

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# PNG colour types with red, green and blue (RGB, RGB with alpha).
PNG_COLOUR_TYPES = (2, 6)
# BMPs TensorFlow decodes as Pillow does: uncompressed (BI_RGB) rows of these bits a pixel;
# 8-bit ones only where their palette is the grey ramp (Pillow's mode "L").
BMP_BITS = (24, 32)
BMP_GREY_BITS = 8
BMP_INFO_HEADER = 40  # BITMAPINFOHEADER; OS/2's 12-byte header places its fields elsewhere
SEND_PNG = "send it as PNG or JPEG"
# Scans a JPEG may hold. Each scan of a progressive JPEG is a pass over every block of the
# image, so a small file of thousands of scans decodes for tens of seconds (libjpeg-turbo's
# TurboJPEG caps them on request, TJPARAM_SCANLIMIT, for this reason); libjpeg's progressive
# encoders write 10 for colour, 6 for grey. Counted as start-of-scan markers, which entropy-coded
# data cannot hold (its 0xFF bytes are stuffed), so an EXIF thumbnail's scans count too.
MAX_JPEG_SCANS = 100
JPEG_START_OF_SCAN = b"\xff\xda"
# What libjpeg may say of a JPEG that both runtimes then decode alike, to the same pixels (its
# warnings JWRN_EXTRANEOUS_DATA, JWRN_HUFF_BAD_CODE, JWRN_BOGUS_PROGRESSION, JWRN_NOT_SEQUENTIAL);
# of the JPEGs it first says anything else of (data that end before the image does, at a marker
# or at the end of the file; a bad table or marker), TensorFlow decodes some that simplejpeg
# refuses and refuses others it decodes. Measured on damaged JPEGs by bench/damaged_jpegs.py
# (docs/benchmarks.md).
JPEG_DECODED_THROUGH = (
    "extraneous bytes before marker",
    "bad Huffman code",
    "Inconsistent progression sequence",
    "Invalid SOS parameters for sequential JPEG",
)
# Frame headers (start of frame, SOF0-SOF15 but for DHT, JPG and DAC), and those of progressive
# JPEGs, whose coefficients come in scans of a few each, in bits from the highest: where its
# scans end before every coefficient has its lowest bit, libjpeg smooths the blocks' missing
# detail, which TensorFlow's libjpeg-turbo does otherwise than simplejpeg's and Pillow's (a few
# levels a pixel apart, though libjpeg complains of nothing).
JPEG_FRAMES = set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
JPEG_PROGRESSIVE_FRAMES = {0xC2, 0xC6, 0xCA, 0xCE}
# Chunks a PNG may hold (a 4096 x 4096 PNG in libpng's 8 KB IDAT chunks has about 6,000): the
# walk over them stays within milliseconds.
MAX_PNG_CHUNKS = 2**16
# Sub-blocks of a GIF, walked one at a time in Python (a chain of one-byte sub-blocks in a 64 MB
# body held a parse thread 2.6 s): a frame's pixel data in at most its pixels' worth, 2 bytes a
# pixel (LZW's 12-bit codes take at most 1.5) in the 255-byte sub-blocks encoders write, plus
# GIF_FRAME_SUB_BLOCKS_SLACK, and at most MAX_GIF_SUB_BLOCKS (a 4096 x 4096 frame's, 18 ms
# to walk); the extensions before it in MAX_GIF_EXTENSION_SUB_BLOCKS together. A request's
# walks are so bounded by its pixels (MAX_REQUEST_PIXELS) and instances.
MAX_GIF_SUB_BLOCKS = 2**17
GIF_FRAME_SUB_BLOCKS_SLACK = 64
MAX_GIF_EXTENSION_SUB_BLOCKS = 2**14
# What an image may hold besides its pixel data: JPEG markers before the first scan, PNG chunks
# other than IDAT, GIF extensions before the first frame, and their bytes. A camera's JPEG
# holds about ten (EXIF, an ICC profile in 64 KB pieces, XMP), a PNG editor's a few dozen.
MAX_HEADER_SEGMENTS = 256
MAX_HEADER_BYTES = 4 * 2**20
# PNG text chunks that Pillow inflates (zTXt; iTXt with its compression flag set), each up to
# Pillow's ImageFile.MAX_TEXT_CHUNK (1 MiB) inflated.
MAX_PNG_COMPRESSED_TEXT = 8
JPEG_START = b"\xff\xd8"
GIF_SIGNATURES = (b"GIF87a", b"GIF89a")
# JPEG markers without a length: TEM and the restart markers RST0-RST7.
JPEG_STANDALONE = {0x01, *range(0xD0, 0xD8)}
JPEG_FILL = re.compile(rb"\xff+")


def check_header(encoded):
    """Raises a ValueError that says why, where `encoded`'s header holds more than
    MAX_HEADER_SEGMENTS blocks or MAX_HEADER_BYTES besides its pixel data, read from its bytes
    before any decoder parses them (what is damaged is left to `check` and the decoders)."""
    if encoded.startswith(PNG_SIGNATURE):
        check_png_header(encoded)
    elif encoded.startswith(JPEG_START):
        check_jpeg_header(encoded)
    elif encoded[:6] in GIF_SIGNATURES:
        check_gif_header(encoded)


def header_bounded(kind, segments, size):
    if segments > MAX_HEADER_SEGMENTS or size > MAX_HEADER_BYTES:
        raise ValueError(
            f"a {kind} whose header holds more than {MAX_HEADER_SEGMENTS} blocks or {MAX_HEADER_BYTES:,} "
            "bytes besides its pixels: this server reads no more"
        )


def check_jpeg_header(encoded):
    """The markers before the first scan (start of scan, SOS), each with its length, and the fill
    bytes before them (0xFF, which Pillow's parser reads one at a time, in Python)."""
    segments = 0
    for marker, _, end, fill in jpeg_markers(encoded):
        if marker == JPEG_START_OF_SCAN[1]:
            return
        segments += fill + 1  # fill bytes before a marker, each a step of a parser
        header_bounded("JPEG", segments, end)


def jpeg_markers(encoded):
    """(marker, its position, the position after its segment, the fill bytes before it) for each
    marker of `encoded` up to its first scan's, segment by segment (an EXIF thumbnail's markers,
    inside a segment, are not among them)."""
    position = len(JPEG_START)
    while position + 4 <= len(encoded) and encoded[position] == 0xFF:
        fill_end = JPEG_FILL.match(encoded, position).end()
        fill = fill_end - position - 1
        position = fill_end - 1
        marker = encoded[position + 1] if position + 1 < len(encoded) else JPEG_START_OF_SCAN[1]
        end = position + (
            2 if marker in JPEG_STANDALONE else 2 + int.from_bytes(encoded[position + 2 : position + 4], "big")
        )
        yield marker, position, end, fill
        if marker == JPEG_START_OF_SCAN[1]:
            return
        position = end


def check_gif_header(encoded):
    """The extensions before the first frame, each a chain of sub-blocks (`first_gif_frame`)."""
    first_gif_frame(encoded)


def first_gif_frame(encoded):
    """The GIF `encoded` cut after its first frame, with its trailer: a GIF of that frame alone,
    which every decoder decodes as the first frame of the whole (TensorFlow's GIF decoder decodes
    every frame of a file, whatever the first one's size); found by walking its blocks, the
    extensions before the frame bounded as `check_header` bounds them. A file whose blocks end
    early is returned whole, for the decoders to refuse."""
    if len(encoded) < 13:
        return encoded
    flags = encoded[10]
    position = 13 + (3 * 2 ** ((flags & 7) + 1) if flags & 0x80 else 0)
    segments, extension_blocks = 0, 0
    while position + 10 <= len(encoded):
        if encoded[position] == 0x21:  # an extension: its label, then sub-blocks
            segments += 1
            position, blocks = after_sub_blocks(
                encoded, position + 2, MAX_GIF_EXTENSION_SUB_BLOCKS - extension_blocks, "its extensions"
            )
            extension_blocks += blocks
            header_bounded("GIF", segments, position)
        elif encoded[position] == 0x2C:  # the first image descriptor, its local colour table, LZW size
            width, height = (
                int.from_bytes(encoded[start : start + 2], "little") for start in (position + 5, position + 7)
            )
            most = min(MAX_GIF_SUB_BLOCKS, width * height * 2 // 255 + GIF_FRAME_SUB_BLOCKS_SLACK)
            local = encoded[position + 9]
            position += 10 + (3 * 2 ** ((local & 7) + 1) if local & 0x80 else 0) + 1
            position, _ = after_sub_blocks(encoded, position, most, f"its {width} x {height} frame")
            return encoded[:position] + b";" if position <= len(encoded) else encoded
        else:
            return encoded
    return encoded


def after_sub_blocks(encoded, position, most=MAX_GIF_SUB_BLOCKS, what="a chain"):
    """(The position after the chain of sub-blocks that starts at `position`, past the end of
    `encoded` where the chain is cut short; its sub-blocks). More than `most` sub-blocks (for
    `what`) are refused, a ValueError: walking them costs time in Python, and no GIF of the
    pixels a request may hold needs them."""
    blocks = 0
    while position < len(encoded) and encoded[position]:
        position += encoded[position] + 1
        blocks += 1
        if blocks > most:
            raise ValueError(
                f"a GIF whose sub-blocks for {what} are more than {most:,} (an encoder writes them 255 bytes "
                "long): this server reads no more"
            )
    return position + 1, blocks


def check(encoded, image_format, mode, channels):
    """Raises a ValueError that says why, where the runtimes would decode `encoded` (of Pillow's
    `image_format` and `mode`, read from its header) differently or one of them not at all,
    for a network of `channels`: `check_structure`, then `check_decoding`."""
    check_structure(encoded, image_format, mode, channels)
    check_decoding(encoded, image_format, mode, channels)


def check_decoding(encoded, image_format, mode, channels):
    """The part of `check` that decodes: a JPEG's trial decode (`check_jpeg_decoding`), which
    costs as much as decoding it (1.4 s for a 1024 x 1023 JPEG of 100 scans), so that the server
    runs it where decoding runs, a large request's on a thread of its own."""
    if image_format in ("JPEG", "MPO"):
        check_jpeg_decoding(encoded, mode, channels)


def check_structure(encoded, image_format, mode, channels):
    """The part of `check` that reads the file's structure alone, in milliseconds."""
    if image_format == "PNG":
        check_png(encoded, channels)
    elif image_format == "BMP":
        check_bmp(encoded, mode)
    elif image_format in ("JPEG", "MPO"):
        check_jpeg_scans(encoded)
    elif image_format == "GIF":
        check_gif(encoded)


def check_gif(encoded):
    """The first frame covers the whole screen: where it leaves part of the screen bare (placed
    at an offset, or smaller), TensorFlow's GIF decoder and Pillow fill that part differently
    (classes apart on 2026-12-07: a 10 x 10 frame at (5, 4) on a 23 x 19 screen). A frame larger
    than its screen is decoded alike by both."""
    if len(encoded) < 13:
        return
    screen = int.from_bytes(encoded[6:8], "little"), int.from_bytes(encoded[8:10], "little")
    flags = encoded[10]
    position = 13 + (3 * 2 ** ((flags & 7) + 1) if flags & 0x80 else 0)
    while position < len(encoded) and encoded[position] == 0x21:
        position, _ = after_sub_blocks(encoded, position + 2)
    if position + 9 > len(encoded) or encoded[position] != 0x2C:
        return  # no frame: the decoders refuse it
    left, top, width, height = (
        int.from_bytes(encoded[start : start + 2], "little") for start in range(position + 1, position + 9, 2)
    )
    if left or top or width < screen[0] or height < screen[1]:
        raise ValueError(
            f"a GIF whose first frame ({width} x {height} at {left}, {top}) leaves part of its {screen[0]} x "
            f"{screen[1]} screen bare, which the two runtimes' decoders fill differently; {SEND_PNG}"
        )


def decode_passes(encoded, image_format):
    """How many times decoding `encoded` goes over its pixels: a JPEG's scans (each scan of a
    progressive JPEG is a pass over every block; a baseline JPEG has one, or one a component),
    one for any other format. A request's decoding cost is its pixels times this, so that a small
    progressive JPEG of many scans is large work (`batching.Batcher`)."""
    if image_format in ("JPEG", "MPO"):
        return max(1, encoded.count(JPEG_START_OF_SCAN))
    return 1


def check_jpeg_scans(encoded):
    """At most MAX_JPEG_SCANS scans."""
    scans = encoded.count(JPEG_START_OF_SCAN)
    if scans > MAX_JPEG_SCANS:
        raise ValueError(
            f"a JPEG of {scans} scans: this server decodes at most {MAX_JPEG_SCANS} (each scan of a "
            "progressive JPEG is a pass over the whole image)"
        )


def check_jpeg_decoding(encoded, mode, channels):
    """Nothing damaged beyond what both decoders decode through alike (`damage`); no incomplete
    progression; no CMYK for a 1-channel model."""
    complaint = damage(encoded, mode)
    if complaint:
        raise ValueError(f"a damaged JPEG: {complaint}")
    if unrefined(encoded):
        raise ValueError(
            "an incomplete progressive JPEG: its scans end before every coefficient has all its bits "
            "(truncated), which the two runtimes' decoders make up differently"
        )
    if mode == "CMYK" and channels == 1:
        raise ValueError(
            f"a CMYK JPEG for a 1-channel model: TensorFlow's JPEG decoder makes no grey of CMYK; {SEND_PNG}"
        )


def damage(encoded, mode):
    """libjpeg's first complaint about `encoded` (of Pillow's `mode`) where it is not one of
    JPEG_DECODED_THROUGH, or the error that ends a decode through it, or None. simplejpeg's
    decode, to its smallest scale and grey (every scan's data read, an eighth of each side of
    the luminance's blocks computed), strict, which stops at the first warning or error; for a
    file it warns of, simplejpeg's decode through the warnings, and Pillow's, which refuses a
    file whose data run out before its last row where simplejpeg's makes up an end."""
    options = dict(colorspace="CMYK" if mode == "CMYK" else "GRAY", min_height=1, min_width=1)
    try:
        simplejpeg.decode_jpeg(encoded, strict=True, **options)
        return None
    except ValueError as complaint:
        if not any(text in str(complaint) for text in JPEG_DECODED_THROUGH):
            return first_line(complaint)
    try:
        simplejpeg.decode_jpeg(encoded, strict=False, **options)
        with Image.open(io.BytesIO(encoded)) as image:
            image.draft("CMYK" if mode == "CMYK" else "L", (1, 1))
            image.load()
    except (ValueError, OSError) as error:
        return first_line(error)
    return None


def unrefined(encoded):
    """Whether `encoded` is a progressive JPEG whose scans leave a coefficient of a component
    short of its lowest bit: read from the headers of its frame and of its scans (components,
    first and last coefficient, and the lowest bit, Al)."""
    frame = first_scan = None
    for marker, position, _, _ in jpeg_markers(encoded):
        if marker in JPEG_FRAMES:
            frame = (marker, position)
        elif marker == JPEG_START_OF_SCAN[1]:
            first_scan = position
    if frame is None or first_scan is None or frame[0] not in JPEG_PROGRESSIVE_FRAMES:
        return False
    try:
        # Marker, length, precision, height and width, then the count of components and 3 bytes each.
        components = {encoded[frame[1] + 10 + 3 * index] for index in range(encoded[frame[1] + 9])}
        lowest_bit = {}
        for scan in re.finditer(re.escape(JPEG_START_OF_SCAN), encoded[first_scan:]):
            header = first_scan + scan.start() + 4
            count = encoded[header]
            first, last, bits = encoded[header + 1 + 2 * count : header + 4 + 2 * count]
            for component in encoded[header + 1 : header + 1 + 2 * count : 2]:
                for coefficient in range(first, last + 1):
                    lowest_bit[component, coefficient] = bits & 0x0F
    except (IndexError, ValueError):  # a header cut short
        return True
    return any(lowest_bit.get((component, coefficient)) != 0 for component in components for coefficient in range(64))


def first_line(error):
    return (str(error).splitlines() or [type(error).__name__])[0][:120]


def check_png_header(encoded):
    """The chunks besides IDAT, anywhere in the file (Pillow reads those after the pixels too),
    within the header's bounds, at most MAX_PNG_COMPRESSED_TEXT of them compressed text."""
    position, kind, chunks = len(PNG_SIGNATURE), b"", 0
    others, other_bytes, compressed_text = 0, 0, 0
    while kind != b"IEND" and position + 8 <= len(encoded) and chunks < MAX_PNG_CHUNKS:
        chunks += 1
        (length,) = struct.unpack(">I", encoded[position : position + 4])
        kind = encoded[position + 4 : position + 8]
        end = position + 12 + length
        if kind != b"IDAT":
            others, other_bytes = others + 1, other_bytes + length
            header_bounded("PNG", others, other_bytes)
            compressed_text += kind == b"zTXt" or (kind == b"iTXt" and compressed_itxt(encoded[position + 8 : end - 4]))
            if compressed_text > MAX_PNG_COMPRESSED_TEXT:
                raise ValueError(
                    f"a PNG of more than {MAX_PNG_COMPRESSED_TEXT} compressed text chunks: this server inflates no more"
                )
        position = end


def check_png(encoded, channels):
    """Every chunk whole, with its CRC, up to IEND (as libpng requires); no 16-bit colour for
    a 1-channel model."""
    position, kind, chunks = len(PNG_SIGNATURE), b"", 0
    while kind != b"IEND":
        chunks += 1
        if chunks > MAX_PNG_CHUNKS:
            raise ValueError(f"a PNG of more than {MAX_PNG_CHUNKS:,} chunks")
        if position + 8 > len(encoded):
            raise ValueError("a damaged PNG: it ends before its IEND chunk (truncated)")
        (length,) = struct.unpack(">I", encoded[position : position + 4])
        kind = encoded[position + 4 : position + 8]
        end = position + 12 + length
        if end > len(encoded):
            raise ValueError(f"a damaged PNG: its {kind.decode('latin-1')!r} chunk is cut short (truncated)")
        (crc,) = struct.unpack(">I", encoded[end - 4 : end])
        if zlib.crc32(encoded[position + 4 : end - 4]) != crc:
            raise ValueError(f"a damaged PNG: its {kind.decode('latin-1')!r} chunk's CRC is wrong")
        if (
            kind == b"IHDR"
            and channels == 1
            and encoded[position + 16] == 16
            and encoded[position + 17] in PNG_COLOUR_TYPES
        ):
            raise ValueError(
                "a 16-bit colour PNG for a 1-channel model: its grey is made from 16 bits by TensorFlow's "
                "decoder and from 8 by Pillow's; send it in 8 bits, as grey, or as JPEG"
            )
        position = end


def check_bmp(encoded, mode):
    """An uncompressed BMP of 24 or 32 bits, or 8 bits of grey, whole."""
    if len(encoded) < 14 + BMP_INFO_HEADER:
        raise ValueError("a damaged BMP: its header is cut short (truncated)")
    (offset,) = struct.unpack("<I", encoded[10:14])
    header, width, height, _, bits, compression = struct.unpack("<IiiHHI", encoded[14:34])
    if header < BMP_INFO_HEADER:
        raise ValueError(
            f"an OS/2 BMP (a header of {header} bytes): TensorFlow's BMP decoder reads Windows BMPs; {SEND_PNG}"
        )
    grey = bits == BMP_GREY_BITS and mode == "L"
    if compression != 0 or not (bits in BMP_BITS or grey):
        kind = f"{bits} bit{'s' if bits != 1 else ''} a pixel" + (" with a palette" if bits <= 8 else "")
        kind += ", compressed" if compression else ""
        raise ValueError(
            f"a BMP of {kind}: TensorFlow's BMP decoder reads uncompressed BMPs of 24 or 32 bits and "
            f"8-bit grey ones only; {SEND_PNG}"
        )
    stride = (abs(width) * bits + 31) // 32 * 4
    if offset + stride * abs(height) > len(encoded):
        raise ValueError(
            f"a damaged BMP: its {abs(height)} rows need {offset + stride * abs(height)} bytes, the file "
            f"has {len(encoded)} (truncated)"
        )


def compressed_itxt(data):
    """Whether an iTXt chunk's data (keyword, NUL, compression flag, ...) says compressed."""
    keyword_end = data.find(b"\0")
    return keyword_end >= 0 and keyword_end + 1 < len(data) and data[keyword_end + 1] == 1
