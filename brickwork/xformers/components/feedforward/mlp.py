"""xformers' ``MLP``, ``FusedMLP`` and ``Conv2DFeedforward`` on brickwork's ``mlp`` and ``conv_mlp``."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import nn

from brickwork.components.feedforward import MLP as BrickworkMLP
from brickwork.components.feedforward import ConvMLP
from brickwork.xformers._compat import require
from brickwork.xformers.components.activations import Activation
from brickwork.xformers.components.feedforward.base import Feedforward, FeedforwardConfig


@dataclasses.dataclass
class MlpConfig(FeedforwardConfig):
    hidden_layer_multiplier: int
    bias: bool


class MLP(Feedforward):
    """``dropout(mlp(x))``: brickwork's MLP (up, activation, dropout, down) and xformers' last dropout."""

    def __init__(
        self,
        dim_model: int,
        dropout: float,
        activation: Activation | str,
        hidden_layer_multiplier: int,
        bias: bool = True,
        *_: Any,
        **__: Any,
    ) -> None:
        super().__init__()
        self.mlp = BrickworkMLP(
            dim_model=dim_model, hidden_dim=hidden_layer_multiplier * dim_model,
            activation=Activation(activation).value, dropout=float(dropout), bias=bias,
        )  # fmt: skip
        self.dropout = nn.Dropout(dropout)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """``[B, T, dim_model]`` -> ``[B, T, dim_model]``."""
        return self.dropout(self.mlp(inputs))


class FusedMLP(MLP):
    """xformers' Triton MLP: brickwork's MLP, whose bias and GELU run as one Triton kernel on CUDA."""


@dataclasses.dataclass
class ConvMlpConfig(FeedforwardConfig):
    hidden_layer_multiplier: int
    dim_model_out: int | None
    act_layer: Any


class Conv2DFeedforward(Feedforward):
    """The convolutional MLP over a square grid of tokens (brickwork ``conv_mlp``)."""

    def __init__(
        self,
        dim_model: int,
        hidden_layer_multiplier: int = 1,
        dim_model_out: int | None = None,
        activation: Activation | str = Activation.GeLU,
        dropout: float = 0.0,
        *_: Any,
        **__: Any,
    ) -> None:
        super().__init__()
        if dim_model_out not in (None, dim_model):
            raise ValueError(
                f"Conv2DFeedforward: dim_model_out={dim_model_out} must equal dim_model={dim_model}"
            )
        self.conv_mlp = ConvMLP(
            dim_model=dim_model, hidden_dim=hidden_layer_multiplier * dim_model,
            activation=Activation(activation).value, dropout=float(dropout),
        )  # fmt: skip
        self.requires_squared_context = True

    def init_weights(self, **_: Any) -> None:
        self.conv_mlp.reset_parameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, dim_model]`` with T a square -> same shape."""
        t = x.shape[-2]
        require(math.isqrt(t) ** 2 == t, f"Conv2DFeedforward requires squared context lengths, got {t}")
        return self.conv_mlp(x)
