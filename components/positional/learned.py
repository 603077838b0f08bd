"""A learned table of absolute positions (GPT-2, BERT), added to token embeddings."""

from __future__ import annotations

import torch
from torch import nn

from brickwork.checks import PositiveInt

from .base import PositionalEncoding, check_offset, check_positions, register_positional


@register_positional("learned")
class LearnedPositionalEmbedding(PositionalEncoding):
    """``x + weight[offset : offset + T]``; x ``[B, T, dim_model]``, ``weight`` ``[max_seq_len, dim_model]``.
    With ``positions`` [B, T], ``x + weight[positions]``.

    Positions past ``max_seq_len`` have no row and raise ValueError (given ``positions``, checked on
    CPU tensors only: on a GPU the check would wait for the device).
    """

    def __init__(self, max_seq_len: PositiveInt, dim_model: PositiveInt) -> None:
        super().__init__()
        self.max_seq_len = max_seq_len
        self.dim_model = dim_model
        self.weight = nn.Parameter(torch.empty(max_seq_len, dim_model))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=0.02)

    def forward(
        self, x: torch.Tensor, offset: int = 0, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        if x.dim() < 2 or x.shape[-1] != self.dim_model:
            raise ValueError(f"expected x of shape [B, T, {self.dim_model}], got {tuple(x.shape)}")
        if positions is not None:
            check_positions(positions, x.shape[-2])
            if positions.device.type == "cpu" and positions.numel():
                low, high = positions.min().item(), positions.max().item()
                if low < 0 or high >= self.max_seq_len:
                    raise ValueError(
                        f"position {low if low < 0 else high} is outside the learned position table "
                        f"[0, max_seq_len={self.max_seq_len})"
                    )
            return x + self.weight[positions]
        start = check_offset(offset)
        end = start + x.shape[-2]
        if end > self.max_seq_len:
            raise ValueError(
                f"positions up to {end} (sequence length {x.shape[-2]} at offset {start}) exceed "
                f"max_seq_len={self.max_seq_len} of the learned position table"
            )
        return x + self.weight[start:end]

    def extra_repr(self) -> str:
        return f"max_seq_len={self.max_seq_len}, dim_model={self.dim_model}"
