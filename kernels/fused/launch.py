"""Launch settings shared by the Triton ops: block sizes, warp counts, program counts, device checks.

A launcher takes ``wrap``: :func:`direct` launches the kernel itself, ``wrap_triton`` (passed by the
``torch.library`` ops, see ``op.py``) lets Dynamo and Inductor see it. Launch parameters that only
depend on the row width are computed once per width and cached.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
import triton

from .._checks import KERNEL_DTYPES, check_float
from ..backend import CPU_TRITON_REFUSED
from .interpreter import INTERPRETED

# Widest row (in elements) one program keeps in registers; wider rows take the looped path.
DEFAULT_MAX_BLOCK = 16384


def direct(kernel: Callable) -> Callable:
    """The eager launch: the kernel itself (the compiled path passes ``wrap_triton`` in its place)."""
    return kernel


def check_max_block(max_block: int, name: str = "max_block") -> None:
    """Raise ValueError unless ``max_block`` is a power of two >= 1."""
    integer = isinstance(max_block, int) and not isinstance(max_block, bool)
    if not integer or max_block < 1 or max_block & (max_block - 1):
        raise ValueError(f"{name} must be a power of two >= 1, got {max_block!r}")


def needs_autograd(*inputs: object) -> bool:
    """Whether autograd must record a call on ``inputs`` (tensors and options); if not, the launchers
    can run without it."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs)


class RowLaunch(NamedTuple):
    """How a row kernel covers rows of one width: the block, whether one block holds a row, the warps."""

    block: int
    single: bool
    warps: int


@functools.lru_cache(maxsize=1024)
def row_launch(n_cols: int, max_block: int) -> RowLaunch:
    """The launch for rows of ``n_cols``: one power-of-two block if it fits ``max_block``, else chunks."""
    block = triton.next_power_of_2(n_cols)
    single = block <= max_block
    block = block if single else max_block
    return RowLaunch(block, single, warps_for(block))


def warps_for(block: int) -> int:
    """Warps per program for a row block of ``block`` elements (about 8-16 elements per thread)."""
    if block <= 1024:
        return 4
    if block <= 4096:
        return 8
    return 16 if block <= 16384 else 32


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def device_programs(device: torch.device, per_sm: int) -> int:
    """``per_sm`` programs for each SM of a CUDA device; 4 on CPU, where the interpreter runs them in turn."""
    if device.type != "cuda":
        return 4
    index = device.index if device.index is not None else torch.cuda.current_device()
    return per_sm * _sm_count(index)


# Row width up to which a norm backward runs NARROW_PROGRAMS_PER_SM programs per SM instead of 2. Each
# program takes its rows one at a time, so narrow rows leave little in flight per program; on an H200
# (8192 bf16 rows), 8 per SM took the LayerNorm backward at width 1024 from 128 to 55 µs and RMSNorm's
# from 48 to 37, and both a little lower at 2048, while at 4096 two per SM stayed the fastest.
NARROW_ROW = 2048
NARROW_PROGRAMS_PER_SM = 8


def reduction_programs(device: torch.device, n_rows: int, n_cols: int) -> int:
    """How many programs share the rows of a backward pass that also sums over rows.

    Each writes one row of partial sums, which torch then adds up: a fixed order, so the result is
    deterministic. Two per SM keeps every SM busy on wide rows, more on narrow ones (see
    ``NARROW_ROW``); on CPU a few exercise the same path. No rows, no programs.
    """
    per_sm = NARROW_PROGRAMS_PER_SM if n_cols <= NARROW_ROW else 2
    return min(n_rows, device_programs(device, per_sm))


def partial_sums(
    param: torch.Tensor | None, programs: int, n_cols: int, device: torch.device
) -> torch.Tensor:
    """A float32 [programs, n_cols] buffer, one row of ``param``'s gradient per program; [0] without it.

    Left uninitialised: each program stores its row once (never adds into it), and with no rows there
    are no programs, so the buffer is empty and sums to zeros.
    """
    shape = (programs, n_cols) if param is not None else (0,)
    return torch.empty(shape, dtype=torch.float32, device=device)


def sum_partials(partials: torch.Tensor, param: torch.Tensor | None) -> torch.Tensor:
    """``param``'s gradient [N]: the rows of ``partials`` added in a fixed order, in ``param``'s dtype."""
    return partials.sum(0).to(param.dtype) if param is not None else partials


def check_launch(name: str, x: torch.Tensor) -> None:
    """``x`` (the argument ``name``) in a dtype the kernels load, on a device they run on in this process.

    Called once where a Triton call enters (the ``*_triton`` functions), after the op's own checks,
    which put its other tensors on x's device; the launchers trust it.
    """
    check_float(name, x, KERNEL_DTYPES)
    if x.device.type == "cpu" and not INTERPRETED:
        raise RuntimeError(CPU_TRITON_REFUSED)
    if x.device.type not in ("cpu", "cuda"):
        raise ValueError(f"the Triton kernels run on CUDA (or CPU through the interpreter), got {x.device}")
