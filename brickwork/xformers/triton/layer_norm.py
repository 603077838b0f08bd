"""xformers' ``FusedLayerNorm`` / ``layer_norm`` on ``brickwork.kernels.layer_norm``."""

from __future__ import annotations

import torch
from torch import nn

from brickwork import kernels


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, eps: float = 1e-06
) -> torch.Tensor:
    """LayerNorm over the last dimension of x ``[..., N]``."""
    return kernels.layer_norm(x, weight, bias, eps)


class FusedLayerNorm(nn.Module):
    """LayerNorm over the last ``normalized_shape`` features, with optional affine parameters."""

    def __init__(self, normalized_shape: int, affine: bool = True, eps: float = 1e-06) -> None:
        super().__init__()
        self.epsilon = eps
        self.weight = nn.Parameter(torch.ones(normalized_shape)) if affine else None
        self.bias = nn.Parameter(torch.zeros(normalized_shape)) if affine else None

    def init_weights(self, *args: object, **kwargs: object) -> None:
        if self.weight is not None:  # affine: a weight and a bias
            nn.init.ones_(self.weight)
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.weight, self.bias, self.epsilon)
