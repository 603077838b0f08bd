"""xformers' patch embedding: a strided convolution from an image (or a square token grid) to tokens."""

from __future__ import annotations

import dataclasses
import math
from enum import Enum

import torch
from torch import nn

from brickwork.xformers._compat import require


class PoolType(str, Enum):
    Conv2D = "CONV_2D"


@dataclasses.dataclass
class PatchEmbeddingConfig:
    in_channels: int
    out_channels: int
    kernel_size: int
    stride: int
    padding: int = 0
    pool_type: PoolType = PoolType.Conv2D


class ConditionalReshape(nn.Module):
    """``[B, H*W, C]`` tokens of a square grid back to ``[B, C, H, W]``; 4-D inputs pass through."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim == 3:
            b, hw, c = x.shape
            side = math.isqrt(hw)
            require(side * side == hw, f"{hw} tokens do not form a square grid")
            x = x.transpose(1, 2).reshape(b, c, side, side)
        return x


class PatchToSequence(nn.Module):
    """``[B, C, H, W]`` -> ``[B, H*W, C]``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(2, 3).transpose(1, 2).contiguous()


def build_patch_embedding(config: PatchEmbeddingConfig | dict) -> nn.Module:
    """Reshape, ``Conv2d(in, out, kernel_size, stride, padding)``, flatten to tokens."""
    if not isinstance(config, PatchEmbeddingConfig):
        config = PatchEmbeddingConfig(**config)
    require(PoolType(config.pool_type) == PoolType.Conv2D, f"unsupported pool_type {config.pool_type!r}")
    conv = nn.Conv2d(
        config.in_channels, config.out_channels, config.kernel_size, config.stride, config.padding
    )
    return nn.Sequential(ConditionalReshape(), conv, PatchToSequence())
