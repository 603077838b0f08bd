"""Launch settings shared by the Triton ops: block sizes, warp counts, program counts, device checks."""

from __future__ import annotations

import functools

import torch
import triton


# Triton picks compiled or interpreted when a function is decorated; this probe records which.
@triton.jit
def _probe_kernel():
    pass


INTERPRETED = not isinstance(_probe_kernel, triton.runtime.JITFunction)

# Widest row (in elements) one program keeps in registers; wider rows take the looped path.
DEFAULT_MAX_BLOCK = 16384


def row_block(n_cols: int, max_block: int) -> tuple[int, bool]:
    """(BLOCK_N, single_block) for rows of ``n_cols``: one power-of-two block if it fits, else chunks."""
    if max_block < 1 or max_block & (max_block - 1):
        raise ValueError(f"max_block must be a power of two >= 1, got {max_block}")
    block = triton.next_power_of_2(n_cols)
    return (block, True) if block <= max_block else (max_block, False)


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
    return per_sm * _sm_count(device.index or 0) if device.type == "cuda" else 4


def reduction_programs(device: torch.device, n_rows: int) -> int:
    """How many programs share the rows of a backward pass that also sums over rows.

    Each writes one row of partial sums, which torch then adds up: a fixed order, so the result is
    deterministic. Two per SM keeps every SM busy; on CPU a few exercise the same path.
    """
    return max(1, min(n_rows, device_programs(device, 2)))


def partial_sums(
    param: torch.Tensor | None, programs: int, n_cols: int, device: torch.device, zeroed: bool = True
) -> torch.Tensor:
    """A float32 [programs, n_cols] buffer, one row of ``param``'s gradient per program; [0] without it.

    ``zeroed=False`` is for kernels that store each row once rather than adding into it.
    """
    shape = (programs, n_cols) if param is not None else (0,)
    return (torch.zeros if zeroed else torch.empty)(shape, dtype=torch.float32, device=device)


def sum_partials(partials: torch.Tensor, param: torch.Tensor | None) -> torch.Tensor:
    """``param``'s gradient [N]: the rows of ``partials`` added in a fixed order, in ``param``'s dtype."""
    return partials.sum(0).to(param.dtype) if param is not None else partials


def check_launch(*tensors: torch.Tensor | None) -> None:
    """All tensors on one device, and a device the kernel can run on in this process."""
    present = [t for t in tensors if t is not None]
    devices = {t.device for t in present}
    if len(devices) > 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(str(d) for d in devices)}")
    device = present[0].device
    if device.type == "cpu" and not INTERPRETED:
        raise RuntimeError(
            "backend='triton' got CPU tensors, but triton was imported without TRITON_INTERPRET=1, so its "
            "kernels are compiled for a GPU. Set TRITON_INTERPRET=1 before starting Python (or import "
            "brickwork.kernels before anything that imports triton) to run them on CPU."
        )
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"the Triton kernels run on CUDA (or CPU through the interpreter), got {device}")
