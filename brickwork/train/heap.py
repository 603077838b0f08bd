"""glibc's heap thresholds for a CPU training process, so that a step reuses the memory the last one freed.

glibc's malloc gives a block above its mmap threshold (128 KiB at first, raised as such blocks are
freed) pages of its own, and returns the top of its heap to the system whenever more than its trim
threshold (twice the mmap threshold) lies free there. A training step frees its activations and
gradients and allocates the same sizes again in the next one, so on CPU it keeps faulting in fresh
zeroed pages for memory it has just handed back (docs/benchmarks.md, "Third round": 3 ms of system
time per iteration of a small model). The fixed thresholds set here keep it: blocks up to 32 MiB
come from the heap, and up to 256 MiB of free heap stays with the process.
"""

from __future__ import annotations

import ctypes
import os
import sys

# mallopt's parameter numbers, from glibc's malloc.h.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 2**20  # the largest glibc accepts on 64-bit systems
TRIM_THRESHOLD_BYTES = 256 * 2**20


def keep_freed_memory() -> bool:
    """Set this process's heap thresholds (above) on Linux, unless the user set glibc's own
    (``MALLOC_*`` or ``GLIBC_TUNABLES`` environment variables); whether they were set.

    The setting lasts as long as the process, and only glibc's allocator reads it (musl ignores it;
    an allocator loaded with ``LD_PRELOAD`` keeps its own policy).
    """
    if not sys.platform.startswith("linux") or "GLIBC_TUNABLES" in os.environ:
        return False
    if any(name.startswith("MALLOC_") for name in os.environ):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
