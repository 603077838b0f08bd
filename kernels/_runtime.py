"""Where a kernel call runs: backend names, whether Triton is installed, and Triton's CPU interpreter.

Triton decides between compiling and interpreting when a function is decorated with ``@triton.jit``,
and its own library functions (``tl.sum``, ``tl.max``, ``tl.randint``, ...) are decorated when
``triton`` is first imported. So ``TRITON_INTERPRET=1`` only takes effect if it is set before anything
imports triton, which ``torch._dynamo`` and ``torch.distributed.pipelining`` do as a side effect.
:func:`prepare_interpreter` runs when ``brickwork.kernels`` is imported (it never imports triton
itself): on a machine without a CUDA device, where compiled Triton cannot run anyway, it sets the
variable if the user has not and triton is not loaded yet, so that ``backend="triton"`` works on CPU
tensors. On a CUDA machine nothing is set and the kernels compile as usual.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

from brickwork.errors import ConfigError

BACKENDS = ("triton", "torch")

# find_spec locates the package without importing it.
TRITON_INSTALLED = importlib.util.find_spec("triton") is not None


def prepare_interpreter() -> None:
    """Set ``TRITON_INTERPRET=1`` if no CUDA device exists, the user left it unset and triton is unloaded."""
    if "triton" in sys.modules or "TRITON_INTERPRET" in os.environ:
        return
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


def triton_interpreted() -> bool:
    """Whether this process runs Triton kernels through the interpreter. Imports triton."""
    from .fused._launch import INTERPRETED

    return INTERPRETED


def check_backend(backend: str | None) -> None:
    """Raise ConfigError unless ``backend`` is None, "triton" or "torch"."""
    if backend is not None and backend not in BACKENDS:
        raise ConfigError(
            f"unknown kernel backend {backend!r} (None picks triton for CUDA tensors, torch elsewhere)",
            path="backend",
            choices=BACKENDS,
            got=backend,
        )


def use_triton(backend: str | None, x: torch.Tensor) -> bool:
    """Whether the call runs the Triton kernel: asked for, or ``None`` with a CUDA tensor in eager mode."""
    check_backend(backend)
    if backend == "triton":
        if not TRITON_INSTALLED:
            raise ImportError("backend='triton' needs the triton package, which is not installed")
        return True
    # While torch.compile traces, None takes the twin: Inductor fuses it with its neighbours (the
    # residual add before a norm, the matmul epilogue before GELU), which an opaque Triton op prevents.
    # Measured on an H100 (docs/kernels.md): compiled training steps ran faster with the twins.
    return backend is None and x.is_cuda and TRITON_INSTALLED and not torch.compiler.is_compiling()
