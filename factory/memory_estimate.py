"""Refuse a model whose weights cannot fit in memory before allocating any of them.

``dim_model=2**40`` passes every spec rule, and without this check the build runs until the allocator
gives up (or the machine swaps). The model is first instantiated on torch's ``meta`` device, which
records every parameter's and buffer's shape and dtype and allocates nothing; their bytes are then
compared with the memory free on the device the real build will use. Only an impossible model is
refused: training needs more than the weights, but that depends on the optimizer and the batch.
A stack of very many layers is checked from one layer's size before its layers are resolved.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

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


def check_fits_in_memory(instantiate: Callable[[], nn.Module]) -> None:
    """Raise ConfigError when the weights of the model ``instantiate()`` builds exceed free memory.

    ``instantiate`` is called once, on the meta device. A build that is itself on the meta device
    (``with torch.device("meta"): build_model(...)``) allocates nothing, so any size passes.
    """
    if torch.get_default_device().type == "meta":
        return
    try:
        with torch.device("meta"):
            model = instantiate()
    except RuntimeError as err:
        if "overflow" not in str(err):
            raise
        raise ConfigError(f"the spec's sizes give a tensor too large for any machine ({err})") from None
    total, largest, largest_bytes = weight_bytes(model)
    device = torch.get_default_device()
    free = available_bytes(device)
    if total > free:
        raise ConfigError(
            f"the model's weights would take {_size(total)} (the largest, {largest}, "
            f"{_size(largest_bytes)}), more than the {_size(free)} of memory free on {device.type}; "
            "make dim_model, vocab_size or the layer count smaller"
        )


def check_stack_fits(block: Any, dim_model: int, num_layers: int, path: str) -> None:
    """Refuse ``num_layers`` copies of the resolved ``block`` whose weights alone exceed free memory,
    before each layer is resolved and instantiated (which, for 10**8 layers, would never finish).

    One block is instantiated on the meta device; its bytes times ``num_layers`` are the estimate.
    """
    from brickwork.factory.build import instantiate_block  # build imports resolve, which calls this

    with torch.device("meta"):
        layer = instantiate_block(block, dim_model)
    per_layer = weight_bytes(layer)[0]
    free = available_bytes(torch.get_default_device())
    if per_layer * num_layers > free:
        raise ConfigError(
            f"{num_layers} layers of {_size(per_layer)} of weights each would take "
            f"{_size(per_layer * num_layers)}, more than the {_size(free)} of memory free; use fewer layers",
            path,
        )


def _size(count: int) -> str:
    value = float(count)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} PiB"
