"""Lambda layer: each query applies a linear map (a "lambda") summarising the context and positions.

Bello, "LambdaNetworks: Modeling Long-Range Interactions Without Attention" (2021),
https://arxiv.org/abs/2102.08602
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from brickwork.checks import PositiveInt
from brickwork.components.attention.base import AttentionMechanism, register_attention
from brickwork.components.attention.masks import key_padding_keep
from brickwork.errors import ConfigError


@register_attention("lambda_layer")
class LambdaLayer(AttentionMechanism):
    """out_n = q_n (λc + λp_n), per head: the content lambda λc = σ(k)ᵀ v with σ a softmax over
    positions, and the position lambda λp_n = Σ_m E[n - m] v_mᵀ with learned relative embeddings
    E ``[2 seq_len - 1, dim_head]``. Linear in length for λc; λp costs ``T² D`` like attention.

    A key-padding mask takes the padded positions out of both lambdas. λc mixes every position, so
    there is no causal form. Sequences may be at most ``seq_len`` long.
    """

    causal_safe = False
    mask_support = "key_padding"
    needs = ("dim_head",)

    def __init__(self, seq_len: PositiveInt | None = None, dim_head: PositiveInt | None = None) -> None:
        super().__init__()
        self.seq_len, self.dim_head = seq_len, dim_head
        self.relative_embedding = nn.Parameter(torch.empty(2 * seq_len - 1, dim_head))
        nn.init.normal_(self.relative_embedding, std=dim_head**-0.5)

    @staticmethod
    def check_options(options: Any) -> None:
        if options.seq_len is None:
            raise ConfigError("is required: the longest sequence the position lambdas cover", "seq_len")
        if options.dim_head is None:
            raise ConfigError("is required (MultiHeadAttention passes it in)", "dim_head")

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """q ``[B, H, Tq, D]``, k/v ``[B, H, Tk, D]`` with Tq, Tk <= seq_len -> ``[B, H, Tq, D]``."""
        self.check_inputs(q, k, v, attn_mask)
        tq, tk = q.shape[-2], k.shape[-2]
        if max(tq, tk) > self.seq_len:
            raise ValueError(f"LambdaLayer: length {max(tq, tk)} exceeds seq_len={self.seq_len}")
        logits = k
        if attn_mask is not None:
            keep = key_padding_keep(attn_mask)  # (B|1, H|1, Tk, 1)
            logits = k.masked_fill(~keep, float("-inf"))
            v = v * keep.to(v.dtype)
        content = logits.softmax(dim=-2).nan_to_num(0.0).transpose(-2, -1) @ v  # (B, H, D, D)
        # Query n (at position n + Tk - Tq) and key m are E[n - m + seq_len - 1] apart.
        pos_q = torch.arange(tq, device=q.device)[:, None] + (tk - tq)
        offsets = pos_q - torch.arange(tk, device=q.device)[None, :] + self.seq_len - 1
        relative = self.relative_embedding[offsets].to(q.dtype)  # (Tq, Tk, D)
        position = torch.einsum("nmk,bhmv->bhnkv", relative, v)  # (B, H, Tq, D, D)
        return q @ content + torch.einsum("bhnk,bhnkv->bhnv", q, position)
