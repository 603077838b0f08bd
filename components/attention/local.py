"""Sliding-window attention: each query sees the keys within ``window_size // 2`` positions of it."""

from __future__ import annotations

import torch

from brickwork.checks import Flag, PositiveInt, Probability
from brickwork.components.attention.base import register_attention
from brickwork.components.attention.sparse import Backend, PatternAttention


@register_attention("local")
class LocalAttention(PatternAttention):
    """Attention restricted to a sliding window of ``window_size`` positions centred on each query
    (only its past half when ``causal``), as in xformers' ``local`` attention. Backends: see
    :class:`~brickwork.components.attention.sparse.PatternAttention`.
    """

    def __init__(
        self,
        window_size: PositiveInt = 5,
        causal: Flag = False,
        dropout: Probability = 0.0,
        backend: Backend = "auto",
    ) -> None:
        super().__init__(causal, dropout, backend)
        self.window_size = window_size

    def keep(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        return (q_pos - k_pos).abs() <= self.window_size // 2
