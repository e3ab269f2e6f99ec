"""Images built to cost a server more than their size says: the serving battery's
(tests/test_serving_battery.py) and the load benchmark's (bench/serving_load.py) attacks."""

import io

from PIL import Image


def gif_parts(encoded):
    """(head: header, screen descriptor and global colour table; the blocks after it, less the
    trailer) of a GIF file."""
    flags = encoded[10]
    position = 13 + (3 * 2 ** ((flags & 7) + 1) if flags & 0x80 else 0)
    head, start = encoded[:position], position
    while encoded[position] != 0x3B:
        if encoded[position] == 0x21:  # an extension: its label, then data blocks
            position += 2
        else:  # an image descriptor, its local colour table, the LZW code size, then data blocks
            local = encoded[position + 9]
            position += 10 + (3 * 2 ** ((local & 7) + 1) if local & 0x80 else 0) + 1
        while encoded[position]:
            position += encoded[position] + 1
        position += 1
    return head, encoded[start:position]


def animated_gif_bomb(first=64, later=4096, frames=16):
    """The battery's GIF: a first frame of first x first pixels on a screen of that size, then
    `frames` frames of later x later pixels (about 13 KB each: one grey)."""
    small, large = io.BytesIO(), io.BytesIO()
    Image.new("L", (first, first), 128).save(small, format="GIF")
    Image.new("L", (later, later), 128).save(large, format="GIF")
    head, block = gif_parts(small.getvalue())
    return head + block + gif_parts(large.getvalue())[1] * frames + b";"


def gif_of_one_byte_sub_blocks(count, side=64):
    """A `side` x `side` GIF whose first frame's data is `count` sub-blocks of one byte each (2
    bytes a block): cheap to send, and costly to walk where sub-blocks are walked one at a time."""
    small = io.BytesIO()
    Image.new("L", (side, side), 128).save(small, format="GIF")
    head, block = gif_parts(small.getvalue())
    while block[0] == 0x21:  # extensions before the frame
        block = block[block_end(block, 2) :]
    descriptor = block[: 10 + 1]  # the image descriptor (no local colour table) and the LZW code size
    return head + descriptor + b"\x01\x00" * count + b"\x00;"


def block_end(blocks, position):
    """The position after the chain of sub-blocks of `blocks` that starts at `position`."""
    while blocks[position]:
        position += blocks[position] + 1
    return position + 1
