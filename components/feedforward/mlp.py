"""The two-layer MLP: up_proj -> activation -> dropout -> down_proj."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from brickwork import kernels
from brickwork.checks import Flag, PositiveInt, Probability
from brickwork.kernels.backend import use_triton

from .activations import GELU_APPROXIMATION, Activation, create_activation
from .base import Feedforward, register_feedforward


def runs_plain(linear: nn.Linear) -> bool:
    """Whether ``linear``'s weights may be read directly instead of calling the module.

    Wrappers such as tensor-parallel sharding swap in tensor subclasses and hang hooks on the module;
    those must see the call, so any hook or non-plain weight sends the caller through the module.
    """
    plain = all(type(p) in (torch.Tensor, nn.Parameter) for p in linear.parameters(recurse=False))
    return plain and not (linear._forward_hooks or linear._forward_pre_hooks)


@register_feedforward("mlp")
class MLP(Feedforward):
    """``down_proj(dropout(act(up_proj(x))))``; x ``[B, T, dim_model]`` -> ``[B, T, dim_model]``.

    With ``gelu``/``gelu_tanh`` and a bias, on a tensor the fused Triton kernel runs on (CUDA, eager),
    the bias add and the GELU run as that one kernel (:func:`brickwork.kernels.bias_gelu`) after a
    bias-free matmul. Elsewhere the bias stays inside the matmul (``addmm``), where it costs nothing:
    the kernel's torch twin would add it in a pass of its own, forward and backward.
    """

    def __init__(
        self,
        dim_model: PositiveInt,
        hidden_dim: PositiveInt | None = None,
        activation: Activation = "gelu",
        dropout: Probability = 0.0,
        bias: Flag = True,
    ) -> None:
        """``hidden_dim`` defaults to ``4 * dim_model``; ``activation`` is a name (gelu, gelu_tanh,
        relu, squared_relu, silu), an ``nn.Module`` (class) or a callable."""
        super().__init__()
        hidden = hidden_dim if hidden_dim is not None else 4 * dim_model
        self.dim_model = dim_model
        self.hidden_dim = hidden
        self.up_proj = nn.Linear(dim_model, hidden, bias=bias)
        self.activation = create_activation(activation)
        self.dropout = nn.Dropout(dropout)
        self.down_proj = nn.Linear(hidden, dim_model, bias=bias)
        fusable = isinstance(activation, str) and activation in GELU_APPROXIMATION and bias
        self._gelu_approximate = GELU_APPROXIMATION[activation] if fusable else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        if self._gelu_approximate is not None and use_triton(None, x) and runs_plain(self.up_proj):
            h = kernels.bias_gelu(F.linear(x, self.up_proj.weight), self.up_proj.bias, self._gelu_approximate)
        else:
            h = self.activation(self.up_proj(x))
        return self.down_proj(self.dropout(h) if self.dropout.p else h)  # p = 0: the identity, uncalled

    def tp_plan(self) -> dict[str, str]:
        return {"up_proj": "colwise", "down_proj": "rowwise"}

    def projections(self) -> tuple[str, ...]:
        return ("up_proj", "down_proj")

    def residual_projections(self) -> tuple[str, ...]:
        return ("down_proj",)
