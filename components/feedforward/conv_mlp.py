"""The convolutional MLP of vision backbones (VAN, PVTv2): pointwise, depthwise 3x3, pointwise.

Guo et al., "Visual Attention Network" (2022), https://arxiv.org/abs/2202.09741
"""

from __future__ import annotations

import math

import torch
from torch import nn

from brickwork.checks import Flag, PositiveInt, Probability
from brickwork.components.feedforward.activations import Activation, create_activation
from brickwork.components.feedforward.base import Feedforward, register_feedforward


@register_feedforward("conv_mlp")
class ConvMLP(Feedforward):
    """``down(act(depthwise(up(x))))`` with 1x1 ``up``/``down`` convolutions and a 3x3 depthwise one
    between them, on the T tokens laid out as a √T x √T grid; x ``[B, T, dim_model]`` -> same shape.

    The depthwise convolution mixes each token with its grid neighbours, which gives the layer its
    position sense in backbones without position embeddings. T must be a perfect square.
    """

    def __init__(
        self,
        dim_model: PositiveInt,
        hidden_dim: PositiveInt | None = None,
        activation: Activation = "gelu",
        dropout: Probability = 0.0,
        bias: Flag = True,
    ) -> None:
        """``hidden_dim`` defaults to ``dim_model``; ``bias`` on all three convolutions."""
        super().__init__()
        hidden = hidden_dim if hidden_dim is not None else dim_model
        self.dim_model, self.hidden_dim = dim_model, hidden
        self.up_proj = nn.Conv2d(dim_model, hidden, 1, bias=bias)
        self.depthwise = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=bias)
        self.activation = create_activation(activation)
        self.down_proj = nn.Conv2d(hidden, dim_model, 1, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # He init by fan-out, as the convolutional backbones it comes from do.
        for conv in (self.up_proj, self.depthwise, self.down_proj):
            fan_out = conv.kernel_size[0] * conv.kernel_size[1] * conv.out_channels // conv.groups
            nn.init.normal_(conv.weight, std=math.sqrt(2.0 / fan_out))
            if conv.bias is not None:
                nn.init.zeros_(conv.bias)

    def projections(self) -> tuple[str, ...]:
        return ("up_proj", "down_proj")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        b, t, c = x.shape
        side = math.isqrt(t)
        if side * side != t:
            raise ValueError(f"ConvMLP needs a square number of tokens (a grid), got {t}")
        grid = x.transpose(1, 2).reshape(b, c, side, side)
        out = self.down_proj(self.activation(self.depthwise(self.up_proj(grid))))
        return self.dropout(out.flatten(2).transpose(1, 2))
