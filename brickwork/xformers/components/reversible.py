"""xformers' reversible sequence of (f, g) pairs: RevNet coupling y1 = x1 + f(x2), y2 = x2 + g(y1).

The coupling runs under ordinary autograd here. brickwork's memory-saving reversible backward (which
recomputes activations instead of storing them) serves brickwork's own stacks, ``reversible: true`` in
a spec (``brickwork.blocks.reversible``)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class ReversibleBlock(nn.Module):
    """One coupling on ``x = [x1, x2]`` split on the last dimension."""

    def __init__(self, f: nn.Module, g: nn.Module, split_dim: int = -1) -> None:
        super().__init__()
        self.f, self.g, self.split_dim = f, g, split_dim

    def forward(
        self, x: torch.Tensor, f_args: dict[str, Any] | None = None, g_args: dict[str, Any] | None = None
    ) -> torch.Tensor:
        x1, x2 = torch.chunk(x, 2, dim=self.split_dim)
        y1 = x1 + self.f(inputs=[x2], **(f_args or {}))
        y2 = x2 + self.g(inputs=[y1], **(g_args or {}))
        return torch.cat([y1, y2], dim=self.split_dim)


class ReversibleSequence(nn.Module):
    """A stack of :class:`ReversibleBlock` s from ``[f, g]`` module pairs."""

    def __init__(self, blocks: nn.ModuleList) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([ReversibleBlock(f, g) for f, g in blocks])

    def forward(
        self, x: torch.Tensor, arg_route: tuple[bool, bool] = (True, False), **kwargs: Any
    ) -> torch.Tensor:
        f_args = kwargs if arg_route[0] else {}
        g_args = kwargs if arg_route[1] else {}
        for block in self.blocks:
            x = block(x, f_args, g_args)
        return x
