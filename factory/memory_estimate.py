"""Refuse a model whose weights cannot fit in memory before allocating any of them.

``dim_model=2**40`` passes every spec rule, and without this check the build runs until the allocator
gives up (or the machine swaps). The factory first builds the model on torch's ``meta`` device, which
records every parameter's and buffer's shape and dtype and allocates nothing; their bytes are then
compared with the memory free on the device the real build will use. Only an impossible model is
refused: training needs more than the weights, but that depends on the optimizer and the batch.
A stack of very many layers is checked from one layer's size before the others are built.
"""

from __future__ import annotations

import torch
from torch import nn

from brickwork.errors import ConfigError
from brickwork.memory import available_bytes, format_bytes, weight_bytes


def check_fits(weights: nn.Module, device: torch.device, copies: int = 1, path: str = "") -> None:
    """Raise ConfigError when ``copies`` of the parameters and buffers of ``weights`` (a model or one
    layer, built on the meta device) exceed the memory free on ``device``."""
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
