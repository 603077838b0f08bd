"""Refuse a model whose weights cannot fit in memory before allocating any of them.

``dim_model=2**40`` passes every spec rule, and without this check the build runs until the allocator
gives up (or the machine swaps). The factory first builds the model on torch's ``meta`` device, which
records every parameter's and buffer's shape and dtype and allocates nothing; their bytes are then
compared with the memory free on the device the real build will use. Only an impossible model is
refused: training needs more than the weights, but that depends on the optimizer and the batch.
A stack of very many layers is checked from one layer's size before the others are built.
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


def check_fits(weights: nn.Module, device: torch.device, copies: int = 1, path: str = "") -> None:
    """Raise ConfigError when ``copies`` of the parameters and buffers of ``weights`` (a model or one
    layer, built on the meta device) exceed the memory free on ``device``."""
    total, largest, largest_bytes = weight_bytes(weights)
    free = available_bytes(device)
    if total * copies <= free:
        return
    what = f"{copies} layers of {_size(total)} each" if copies > 1 else "the model's weights"
    raise ConfigError(
        f"{what} would take {_size(total * copies)} (the largest, {largest}, {_size(largest_bytes)}), "
        f"more than the {_size(free)} of memory free on {device.type}; make dim_model, vocab_size or "
        "the layer count smaller",
        path,
    )


def _size(count: int) -> str:
    value = float(count)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"
