"""Where a kernel call runs: backend names, whether Triton is installed, and Triton's CPU interpreter.

Triton decides between compiling and interpreting when a function is decorated with ``@triton.jit``,
and its own library functions (``tl.sum``, ``tl.max``, ``tl.randint``, ...) are decorated when
``triton`` is first imported. So ``TRITON_INTERPRET=1`` only takes effect if it is set before anything
imports triton, which ``torch._dynamo``, ``torch.nn.attention`` and ``torch.distributed.pipelining`` do
as a side effect, and the choice then holds for the whole process. Importing ``brickwork.kernels``
sets nothing. The interpreter is chosen where a CPU Triton backend is chosen:

- per call: a ``backend="triton"`` call on CPU tensors, while triton is not loaded yet, chooses it;
- by the program, before it imports anything that loads triton: :func:`use_triton_interpreter`
  (``brickwork train`` does this for a run on CPU, the test suite's conftest where there is no GPU).

Once triton is loaded compiled, a ``backend="triton"`` call on CPU tensors is refused with an error
that says how to choose the interpreter.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

from brickwork.errors import ConfigError
from brickwork.extras import missing_package

BACKENDS = ("triton", "torch")

# find_spec locates the package without importing it.
TRITON_INSTALLED = importlib.util.find_spec("triton") is not None


def use_triton_interpreter() -> None:
    """Run this process's Triton kernels through the interpreter, so that ``backend="triton"`` works on
    CPU tensors. Call it before anything imports triton; once triton is loaded compiled it raises
    RuntimeError saying how to choose the interpreter instead. A no-op where it is already chosen."""
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    elif not triton_interpreted():
        raise RuntimeError(CPU_TRITON_REFUSED)


CPU_TRITON_REFUSED = (
    "backend='triton' on CPU tensors runs Triton's interpreter, but triton was already imported "
    "compiled in this process (torch.nn.attention, torch._dynamo and torch.distributed.pipelining import "
    "it). Call brickwork.kernels.use_triton_interpreter() before importing them, or set "
    "TRITON_INTERPRET=1 before starting Python"
)


def triton_interpreted() -> bool:
    """Whether this process runs Triton kernels through the interpreter. Imports triton."""
    from .fused.interpreter import INTERPRETED

    return INTERPRETED


def check_backend(backend: str | None) -> None:
    """Raise ConfigError unless ``backend`` is None, "triton" or "torch"."""
    if backend is not None and backend not in BACKENDS:
        raise ConfigError(
            f"unknown kernel backend {backend!r} (None picks each kernel's default)",
            path="backend",
            choices=BACKENDS,
            got=backend,
        )


def use_triton(backend: str | None, x: torch.Tensor, by_default: bool = True) -> bool:
    """Whether the call runs the Triton kernel: asked for, or ``None`` with a CUDA tensor in eager mode
    for a kernel whose default is Triton (``by_default``; RMSNorm's is not: :func:`rms_norm_uses_triton`)."""
    check_backend(backend)
    if backend == "triton":
        if not TRITON_INSTALLED:
            raise ImportError(missing_package("triton", "backend='triton'"))
        if not x.is_cuda and "triton" not in sys.modules:
            use_triton_interpreter()  # this call is the first to choose Triton on CPU: interpret it
        return True
    # While torch.compile traces, None takes the twin: Inductor fuses it with its neighbours (the
    # residual add before a norm, the matmul epilogue before GELU), which an opaque Triton op prevents.
    # Measured on an H100 (docs/kernels.md): compiled training steps ran faster with the twins.
    return (
        by_default
        and backend is None
        and x.is_cuda
        and TRITON_INSTALLED
        and not torch.compiler.is_compiling()
    )


def rms_norm_uses_triton(backend: str | None, x: torch.Tensor) -> bool:
    """:func:`use_triton` for RMSNorm, whose ``None`` takes the twin on every device.

    torch's own fused RMSNorm costs the host a fraction of a Triton launch's time (about 12 against 65-85 µs
    a forward, 70-80 against 180 a backward, docs/kernels.md), for at most a few µs of device time at
    a small model's widths: on an H200 the eager Llama-shaped training step took 36.1 ms with the
    twin RMSNorm against 48.0 with the Triton one (bf16, 8 × 1024 tokens,
    benchmarks/results/model_step_NVIDIA_H200.md), the step waiting on the host.
    ``"triton"`` still runs the kernel, eager or compiled. LayerNorm keeps the Triton default: torch's
    LayerNorm backward is slow on the device, and there the Triton kernel won or tied.
    """
    return use_triton(backend, x, by_default=False)
