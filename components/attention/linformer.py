"""Linformer: keys and values projected along the sequence to ``k`` rows before softmax attention.

Wang et al., "Linformer: Self-Attention with Linear Complexity" (2020), https://arxiv.org/abs/2006.04768
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from brickwork.checks import PositiveInt, Probability
from brickwork.components.attention.base import AttentionMechanism, register_attention
from brickwork.components.attention.masks import key_padding_keep
from brickwork.components.attention.scaled_dot_product import dense_attention
from brickwork.errors import ConfigError


@register_attention("linformer")
class LinformerAttention(AttentionMechanism):
    """softmax(q (E k)ᵀ / √D) (F v), with learned ``E``, ``F`` of shape ``[k, seq_len]`` shared by all heads.

    Sequences shorter than ``seq_len`` use the first Tk columns of E and F, which is exactly the same as
    zero-padding k and v up to ``seq_len``. A key-padding mask zeroes the masked keys and values before
    the projection, so masked tokens cannot reach any output. There is no causal form: every projected
    row mixes the whole sequence.
    """

    causal_safe = False
    mask_support = "key_padding"

    def __init__(
        self, seq_len: PositiveInt | None = None, k: PositiveInt | None = None, dropout: Probability = 0.0
    ) -> None:
        super().__init__()
        self.seq_len, self.dropout = seq_len, dropout
        self.dim_projection = k if k is not None else max(seq_len // 4, 1)
        self.key_projection = nn.Parameter(torch.empty(self.dim_projection, seq_len))
        self.value_projection = nn.Parameter(torch.empty(self.dim_projection, seq_len))
        self.reset_parameters()

    @staticmethod
    def check_options(options: Any) -> None:
        if options.seq_len is None:
            raise ConfigError("is required: the longest sequence the projections cover", "seq_len")

    def reset_parameters(self) -> None:
        # The init of nn.Linear(seq_len, k), which these projections are.
        for weight in (self.key_projection, self.value_projection):
            nn.init.kaiming_uniform_(weight, a=math.sqrt(5))

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """q ``[B, H, Tq, D]``, k/v ``[B, H, Tk, D]`` with Tk <= seq_len -> ``[B, H, Tq, D]``."""
        self.check_inputs(q, k, v, attn_mask)
        tk = k.shape[-2]
        if tk > self.seq_len:
            raise ValueError(f"LinformerAttention: key length {tk} exceeds seq_len={self.seq_len}")
        if attn_mask is not None:
            keep = key_padding_keep(attn_mask).to(k.dtype)
            k, v = k * keep, v * keep
        k = torch.einsum("ps,bhsd->bhpd", self.key_projection[:, :tk].to(k.dtype), k)  # (B, H, k, D)
        v = torch.einsum("ps,bhsd->bhpd", self.value_projection[:, :tk].to(v.dtype), v)
        return dense_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
