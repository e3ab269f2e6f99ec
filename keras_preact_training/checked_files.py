"""Reading the JSON files and making the folders of runs and exports, with errors that name the path.

A run's `summary.json`, an export's `metadata.json` and the zoo's registry are read by
`read_json`; a corrupt or truncated file is a `ValueError` that names it and says how to
make it again, never a bare `JSONDecodeError`. `make_directory` refuses a folder that
cannot be made (a regular file in its way) the same way.
"""

import json
import os


def read_json(path, remedy):
    """The JSON object in `path`.

    Args:
        path: the file.
        remedy: what to do about a damaged file, for the message ("train the run again").

    Raises:
        FileNotFoundError: if `path` does not exist.
        ValueError: naming `path`, if it is not a regular file holding a JSON object.
        OSError: if it cannot be read (no permission).
    """
    if os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path):
        # Opened, a FIFO would wait for a writer.
        raise ValueError(f"{path} is not a regular file (a FIFO, a socket or a device): {remedy}.")
    try:
        with open(path, "rb") as file:
            value = json.load(file)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is missing: {remedy}.") from None
    except IsADirectoryError:
        raise ValueError(f"{path} is a folder, not a JSON file: {remedy}.") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ValueError(f"{path} is not valid JSON (truncated or corrupt: {str(error)[:120]}): {remedy}.") from None
    if not isinstance(value, dict):
        raise ValueError(
            f"{path} must hold a JSON object. Received: {type(value).__name__}. {remedy[:1].upper()}{remedy[1:]}."
        )
    return value


def make_directory(path, what):
    """Makes the folder `path` (and its parents) if it does not exist.

    Raises:
        ValueError: naming `path`, if it or a parent is a regular file (or otherwise cannot be made).
    """
    try:
        os.makedirs(path, exist_ok=True)
    except (FileExistsError, NotADirectoryError, PermissionError) as error:
        blocking = next(
            (parent for parent in parents(path) if os.path.exists(parent) and not os.path.isdir(parent)), None
        )
        reason = f"{blocking} is a file, not a folder" if blocking else (error.strerror or str(error))
        raise ValueError(f"Cannot make the {what} {path}: {reason}. Choose another path. Received: {path!r}") from None


def parents(path):
    """`path` and each folder above it, nearest first."""
    path = os.path.abspath(path)
    while True:
        yield path
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent
