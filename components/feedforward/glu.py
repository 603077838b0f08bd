"""Gated linear unit feedforwards (Shazeer 2020): ``down(act(gate(x)) * up(x))``."""

from __future__ import annotations

import torch
from torch import nn

from brickwork.checks import Flag, PositiveInt, Probability

from .activations import Activation, create_activation
from .base import Feedforward, register_feedforward


def default_glu_hidden_dim(dim_model: int, multiple_of: int = 8) -> int:
    """``8/3 * dim_model`` rounded up to ``multiple_of``: about the parameter count of a 4x MLP."""
    hidden = (8 * dim_model + 2) // 3
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@register_feedforward("glu")
class GLU(Feedforward):
    """``down_proj(dropout(act(gate_proj(x)) * up_proj(x)))``; x ``[B, T, dim_model]`` -> same shape.

    ``hidden_dim`` defaults to :func:`default_glu_hidden_dim`. Biases are off by default, as in the
    GLU-variants paper and LLaMA. ``activation`` is any name, module or callable (``relu`` gives ReGLU).
    """

    def __init__(
        self,
        dim_model: PositiveInt,
        hidden_dim: PositiveInt | None = None,
        activation: Activation = "silu",
        dropout: Probability = 0.0,
        bias: Flag = False,
    ) -> None:
        super().__init__()
        hidden = hidden_dim if hidden_dim is not None else default_glu_hidden_dim(dim_model)
        self.dim_model = dim_model
        self.hidden_dim = hidden
        self.gate_proj = nn.Linear(dim_model, hidden, bias=bias)
        self.up_proj = nn.Linear(dim_model, hidden, bias=bias)
        self.activation = create_activation(activation)
        self.dropout = nn.Dropout(dropout)
        self.down_proj = nn.Linear(hidden, dim_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return self.down_proj(self.dropout(self.activation(self.gate_proj(x)) * self.up_proj(x)))

    def tp_plan(self) -> dict[str, str]:
        return {"gate_proj": "colwise", "up_proj": "colwise", "down_proj": "rowwise"}

    def projections(self) -> tuple[str, ...]:
        return ("gate_proj", "up_proj", "down_proj")

    def residual_projections(self) -> tuple[str, ...]:
        return ("down_proj",)


@register_feedforward("swiglu")
class SwiGLU(GLU):
    """GLU with SiLU (Swish) gating, as in PaLM and LLaMA."""

    def __init__(
        self,
        dim_model: PositiveInt,
        hidden_dim: PositiveInt | None = None,
        dropout: Probability = 0.0,
        bias: Flag = False,
    ) -> None:
        super().__init__(dim_model, hidden_dim, "silu", dropout, bias)


@register_feedforward("geglu")
class GeGLU(GLU):
    """GLU with exact GELU gating (Shazeer 2020)."""

    def __init__(
        self,
        dim_model: PositiveInt,
        hidden_dim: PositiveInt | None = None,
        dropout: Probability = 0.0,
        bias: Flag = False,
    ) -> None:
        super().__init__(dim_model, hidden_dim, "gelu", dropout, bias)
