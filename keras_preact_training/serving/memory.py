"""Memory a large request freed, given back to the system.

glibc's malloc keeps what a process frees for its next allocations: after requests of large
images and bodies both servers held far more than warm (docs/benchmarks-history.md, "One answer per
image, bounded bodies, cancellation and memory"). glibc raises its thresholds as large
blocks are freed (mallopt(3): the one for mapping a block apart up to 32 MiB, the one for
trimming the heap's top to twice that), so freed bodies, strings and pixels stay in the
heap. Two settings bring both servers back near warm: the mapping threshold fixed at its highest (`map_large_blocks_apart`, at start),
which by mallopt(3) also fixes the trimming threshold at its default of 128 KiB, and
`malloc_trim(0)` after a request of a large body (`give_back`), which returns the free pages
of every arena (glibc 2.8 and later). Elsewhere (musl, macOS, Windows) both are nothing:
those allocators give memory back by their own rules.
"""

import ctypes
import ctypes.util

# A request whose body is at least this large is followed by a trim: about 1 ms of the
# parsing thread's time, spent only where megabytes were freed.
TRIM_AFTER_BYTES = 2**20
# glibc's mallopt parameter for the size from which blocks are mapped apart (malloc.h), and
# the size set: glibc's own threshold at its highest, fixed there. A decoded 4096 x 4096 image
# (48 MiB) is mapped apart; smaller blocks, the network's buffers among them, stay in the heap
# and are reused from one request to the next (at 16 MiB, the TensorFlow server answered a
# lone client about a fifth slower).
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20


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
