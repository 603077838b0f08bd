"""Bytes: what a module's tensors take, what a device has free, and how a size is printed.

The factory refuses a model whose weights cannot fit (:func:`check_fits`), the trainer a batch that
cannot, and ``dist: auto`` sizes its layouts by what each process has free; all three read these same
figures.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from brickwork.errors import ConfigError


def weight_bytes(model: nn.Module) -> tuple[int, str, int]:
    """(bytes of all parameters and buffers, the name of the largest, its bytes). Tied tensors count once."""
    seen: set[int] = set()
    total, largest, largest_bytes = 0, "", 0
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    for name, tensor in named:
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        size = tensor.numel() * tensor.element_size()
        total += size
        if size > largest_bytes:
            largest, largest_bytes = name, size
    return total, largest, largest_bytes


def available_bytes(device: torch.device) -> int:
    """Free memory on ``device``: the CUDA allocator's free bytes, else the OS's available memory."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def format_bytes(count: float) -> str:
    """``count`` bytes in the largest binary unit under 1024 of it: ``"4.0 KiB"``, ``"476.8 GiB"``."""
    value = float(count)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"


def check_fits(weights: nn.Module, device: torch.device, copies: int = 1, path: str = "") -> None:
    """Raise ConfigError when ``copies`` of the parameters and buffers of ``weights`` exceed the memory
    free on ``device``.

    ``weights`` (a model, or one layer of a stack of ``copies``) is built on the meta device, which
    records every shape and allocates nothing, so ``dim_model=2**40`` is refused before the allocator
    runs out or the machine swaps. Only an impossible model is refused: training needs more than the
    weights, but how much depends on the optimizer and the batch.
    """
    total, largest, largest_bytes = weight_bytes(weights)
    free = available_bytes(device)
    if total * copies <= free:
        return
    what = f"{copies} layers of {format_bytes(total)} each" if copies > 1 else "the model's weights"
    raise ConfigError(
        f"{what} would take {format_bytes(total * copies)} (the largest, {largest}, "
        f"{format_bytes(largest_bytes)}), more than the {format_bytes(free)} free on {device.type}; "
        "make dim_model, vocab_size or the layer count smaller",
        path,
    )
