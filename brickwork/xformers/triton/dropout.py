"""xformers' fused ``dropout(activation(x + bias))`` and ``FusedDropoutBias``.

With GELU the three steps run as ``brickwork.kernels.bias_gelu_dropout`` (one Triton kernel on CUDA,
its Philox mask seeded from torch's global generator, so ``torch.manual_seed`` reproduces a draw);
the other activations run as brickwork's activation module and ``torch.nn.functional.dropout``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from brickwork import kernels
from brickwork.xformers._compat import require
from brickwork.xformers.components.activations import Activation, build_activation


def dropout(
    x: torch.Tensor, p: float, bias: torch.Tensor | None = None, activation: Activation | str | None = None
) -> torch.Tensor:
    """``dropout(activation(x + bias), p)``; x ``[..., N]``, bias ``[N]``."""
    require(0.0 <= p <= 1.0, f"p must be in [0, 1], got {p}")
    if p == 1.0:
        return torch.zeros_like(x)
    if activation is not None and Activation(activation) == Activation.GeLU:
        seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
        return kernels.bias_gelu_dropout(x, bias, float(p), seed)
    y = x + bias if bias is not None else x
    y = build_activation(activation)(y)
    return F.dropout(y, p) if p > 0.0 else y


class FusedDropoutBias(nn.Module):
    """``dropout(activation(x + bias))`` with a learned bias of ``bias_shape`` (zeros at first)."""

    def __init__(self, p: float, bias_shape: int | None, activation: Activation | str | None = None) -> None:
        super().__init__()
        require(p < 1.0, f"p={p} would drop every value")
        self.p, self.activation_type = float(p), activation
        self.bias = nn.Parameter(torch.zeros(bias_shape)) if bias_shape is not None else None

    def init_weights(self, *args: object, **kwargs: object) -> None:
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.p if self.training else 0.0
        bias = self.bias.to(x.dtype) if self.bias is not None else None
        return dropout(x, p, bias, self.activation_type)
