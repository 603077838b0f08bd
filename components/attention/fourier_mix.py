"""FNet token mixing: the real part of a 2D Fourier transform over the sequence and hidden dimensions.

Lee-Thorp et al., "FNet: Mixing Tokens with Fourier Transforms" (2021), https://arxiv.org/abs/2105.03824
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from brickwork.checks import Probability
from brickwork.components.attention.base import AttentionMechanism, register_attention


@register_attention("fourier_mix")
class FourierMix(AttentionMechanism):
    """out = Re(FFT2(v)) over (T, D) for each head; q and k are not used.

    Inside :class:`MultiHeadAttention` this mechanism receives the layer input itself, split into heads
    (``requires_input_projection = False``); with one head that is FNet's mix over the whole hidden
    state. It mixes every position with every other, so it has no causal form and takes no mask.
    """

    causal_safe = False
    mask_support = "none"
    requires_input_projection = False

    def __init__(self, dropout: Probability = 0.0) -> None:
        super().__init__()
        self.dropout = dropout

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """q/k/v ``[B, H, T, D]`` (only v is read) -> ``[B, H, T, D]``."""
        self.check_inputs(q, k, v, attn_mask)
        # Half-precision FFTs only take power-of-two sizes on CUDA; fp32 works for every length.
        dtype = torch.promote_types(v.dtype, torch.float32)
        out = torch.fft.fft2(v.to(dtype), dim=(-2, -1)).real.to(v.dtype)
        return F.dropout(out, self.dropout, self.training)
