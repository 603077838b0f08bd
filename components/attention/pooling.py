"""PoolFormer token mixing: average pooling over the sequence, minus the input.

Yu et al., "MetaFormer Is Actually What You Need for Vision" (2022), https://arxiv.org/abs/2111.11418
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from brickwork.checks import Flag, PositiveInt
from brickwork.components.attention.base import AttentionMechanism, register_attention
from brickwork.errors import ConfigError


@register_attention("pooling")
class Pooling(AttentionMechanism):
    """out[t] = mean(v[t - p .. t + p]) - v[t] with p = pool_size // 2, windows clipped at the sequence ends.

    The ``- v`` cancels the residual connection around the mixer, as in PoolFormer. Like
    :class:`FourierMix` it works on the layer input itself (``requires_input_projection = False``), reads
    only v, looks at future tokens, and takes no mask.
    """

    causal_safe = False
    mask_support = "none"
    requires_input_projection = False

    def __init__(self, pool_size: PositiveInt = 3, grid: Flag = False) -> None:
        """``grid``: the T tokens are a √T x √T grid (image patches) pooled over 2-D windows, as
        PoolFormer does on images; otherwise windows run along the sequence."""
        super().__init__()
        self.pool_size, self.grid = pool_size, grid

    @staticmethod
    def check_options(options: Any) -> None:
        if options.pool_size % 2 == 0:
            raise ConfigError(f"must be odd so the window centres on each token, got {options.pool_size}",
                              "pool_size")  # fmt: skip

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """q/k/v ``[B, H, T, D]`` (only v is read) -> ``[B, H, T, D]``."""
        self.check_inputs(q, k, v, attn_mask)
        b, h, t, d = v.shape
        shape, pool = (t,), F.avg_pool1d  # pool along the sequence
        if self.grid:
            side = math.isqrt(t)
            if side * side != t:
                raise ValueError(f"Pooling with grid=True needs a square number of tokens, got {t}")
            shape, pool = (side, side), F.avg_pool2d
        x = v.transpose(-2, -1).reshape(b * h, d, *shape)
        pooled = pool(x, self.pool_size, stride=1, padding=self.pool_size // 2, count_include_pad=False)
        return pooled.reshape(b, h, d, t).transpose(-2, -1) - v
