"""SHA-256 of files, for the weights registry and the exported models' ONNX files.

Imports nothing heavy: the onnxruntime server checks its models with it without Keras.
"""

import hashlib

# Bytes read at a time.
CHUNK_BYTES = 2**20


def sha256(path):
    """The SHA-256 of the file at `path`, as 64 hexadecimal digits."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(CHUNK_BYTES):
            digest.update(block)
    return digest.hexdigest()
