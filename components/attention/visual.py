"""Large-kernel attention (the Visual Attention Network's mixer) over a square grid of tokens.

Guo et al., "Visual Attention Network" (2022), https://arxiv.org/abs/2202.09741
"""

from __future__ import annotations

import math

import torch
from torch import nn

from brickwork.checks import PositiveInt
from brickwork.components.attention.base import AttentionMechanism, register_attention


@register_attention("visual")
class VisualAttention(AttentionMechanism):
    """out = u ⊙ pointwise(dilated_depthwise(depthwise(u))) on the T tokens laid out as a √T x √T grid.

    A depthwise 5x5 convolution, a depthwise 7x7 one with dilation 3 and a 1x1 convolution build a
    21x21 receptive field cheaply; the result gates the input. Like :class:`FourierMix` it works on the
    layer input itself (``requires_input_projection = False``, reading only v, whose heads it joins
    back into the ``num_heads * dim_head`` channels), sees the whole grid, and takes no mask. T must
    be a perfect square (patches of a square image, without a class token).
    """

    causal_safe = False
    mask_support = "none"
    requires_input_projection = False
    needs = ("num_heads", "dim_head")

    def __init__(self, num_heads: PositiveInt | None = None, dim_head: PositiveInt | None = None) -> None:
        super().__init__()
        if num_heads is None or dim_head is None:
            raise ValueError("VisualAttention needs num_heads and dim_head (MultiHeadAttention gives them)")
        channels = num_heads * dim_head
        self.depthwise = nn.Conv2d(channels, channels, 5, padding=2, groups=channels)
        self.dilated = nn.Conv2d(channels, channels, 7, padding=9, dilation=3, groups=channels)
        self.pointwise = nn.Conv2d(channels, channels, 1)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """q/k/v ``[B, H, T, D]`` (only v is read), T a perfect square -> ``[B, H, T, D]``."""
        self.check_inputs(q, k, v, attn_mask)
        b, h, t, d = v.shape
        side = math.isqrt(t)
        if side * side != t:
            raise ValueError(f"VisualAttention needs a square number of tokens (a grid), got {t}")
        grid = v.transpose(1, 2).reshape(b, side, side, h * d).permute(0, 3, 1, 2)  # (B, C, S, S)
        gated = grid * self.pointwise(self.dilated(self.depthwise(grid)))
        return gated.permute(0, 2, 3, 1).reshape(b, t, h, d).transpose(1, 2)
