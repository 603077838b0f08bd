"""xformers' simplicial embedding: the features split into L chunks, each softmax-normalised."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from brickwork.kernels import masked_softmax
from brickwork.xformers._compat import require
from brickwork.xformers.utils import FromConfig


@dataclasses.dataclass
class SimplicialEmbeddingConfig:
    L: int
    temperature: float


class SimplicialEmbedding(FromConfig, nn.Module):
    """Lavoie et al., "Simplicial Embeddings" (2022): softmax over each of ``L`` chunks of the features,
    scaled by 1 / ``temperature``; x ``[B, T, E]`` with E divisible by L."""

    def __init__(self, L: int, temperature: float | None = None) -> None:
        super().__init__()
        self.L, self.temperature = L, temperature

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, e = x.shape
        require(
            e % self.L == 0,
            f"The embedding dimension {e} is not divisible by the chosen L parameter {self.L}",
        )
        scale = 1.0 / self.temperature if self.temperature is not None else 1.0
        return masked_softmax(x.reshape(b, t, self.L, e // self.L), scale=scale).reshape(b, t, e)
