"""xformers' ``PositionEmbedding`` base and its config."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from brickwork.xformers.utils import FromConfig


@dataclasses.dataclass
class PositionEmbeddingConfig:
    name: str
    dim_model: int
    seq_len: int


class PositionEmbedding(FromConfig, nn.Module):
    """Base of the position embeddings: ``forward(x)`` with x ``[B, T]`` or ``[B, T, E]``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
