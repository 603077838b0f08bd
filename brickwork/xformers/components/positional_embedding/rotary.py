"""xformers' ``RotaryEmbedding`` (and its helpers) on brickwork's rotary embedding."""

from __future__ import annotations

from typing import Any

import torch

from brickwork.components.positional import RotaryEmbedding as BrickworkRotary
from brickwork.xformers.components.positional_embedding.base import PositionEmbedding


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2]`` -> ``[-x2, x1]`` over the last dimension (the halves pair channel i with i + D/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x ``[B, H, T, D]`` rotated by tables ``[1, 1, >=T, D]`` (cropped to T)."""
    cos, sin = cos[:, :, : x.shape[-2], :], sin[:, :, : x.shape[-2], :]
    return x * cos + rotate_half(x) * sin


class RotaryEmbedding(PositionEmbedding):
    """``forward(q, k) -> (q, k)`` rotated from position 0 each (brickwork ``rotary``, halves paired)."""

    def __init__(self, dim_model: int, *_: Any, **__: Any) -> None:
        super().__init__()
        self.rotary = BrickworkRotary(dim_head=dim_model)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q ``[B, H, Tq, D]``, k ``[B, H, Tk, D]``; the lengths may differ."""
        return self.rotary.rotate(q), self.rotary.rotate(k)
