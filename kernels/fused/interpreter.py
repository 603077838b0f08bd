"""Whether this process runs Triton kernels compiled or through the interpreter. Importing it imports
triton, which fixes that choice (``TRITON_INTERPRET`` is read when a function is decorated)."""

from __future__ import annotations

import triton


# Triton picks compiled or interpreted when a function is decorated; this probe records which.
@triton.jit
def _probe_kernel():
    pass


INTERPRETED = not isinstance(_probe_kernel, triton.runtime.JITFunction)
