"""Memory a large request freed, given back to the system.

glibc's malloc keeps what a process frees for its next allocations: after four requests of
four 4096 x 4096 PNGs and four 57 MB bodies, the onnxruntime server held 485 MB where it held
112 MB warm, the TensorFlow one 1,130 MB against 838 MB (the freed bodies, strings and pixels
kept in malloc's heap, whose threshold for mapping large blocks apart rises, as they are
freed, up to 32 MiB). Two settings bring both within 12 % of warm (103-112 % measured,
2026-11-26): blocks of MMAP_THRESHOLD bytes or more always mapped apart, so that freeing
them unmaps them (`map_large_blocks_apart`, at start), and `malloc_trim(0)` after a request
of a large body (`give_back`), which returns the free pages of every arena (glibc 2.8 and
later). Elsewhere (musl, macOS, Windows) both are nothing: those allocators give memory back
by their own rules.
"""

import ctypes
import ctypes.util

# A request whose body is at least this large is followed by a trim: about 1 ms of the
# parsing thread's time, spent only where megabytes were freed.
TRIM_AFTER_BYTES = 2**20
# glibc's mallopt parameter for the size from which blocks are mapped apart (malloc.h), and
# the size set: a decoded 4096 x 4096 image (48 MiB) or a body of tens of megabytes is mapped
# apart, a network's activations at batch 64 (4 MiB for ResNet-20) stay in the heap, where
# they are reused from one batch to the next.
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 16 * 2**20


def _glibc(function):
    """A function of glibc's, or None where the C library has none of that name."""
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), function) if name else None
    except (OSError, AttributeError):
        return None


MALLOC_TRIM, MALLOPT = _glibc("malloc_trim"), _glibc("mallopt")


def map_large_blocks_apart():
    """From now on, blocks of MMAP_THRESHOLD bytes or more are mapped apart and unmapped when
    freed (glibc; elsewhere nothing)."""
    if MALLOPT is not None:
        MALLOPT(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def give_back():
    """Gives the pages malloc holds free back to the system (glibc; elsewhere nothing)."""
    if MALLOC_TRIM is not None:
        MALLOC_TRIM(0)
