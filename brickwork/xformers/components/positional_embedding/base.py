"""xformers' ``PositionEmbedding`` base and its config."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from torch import nn


@dataclasses.dataclass
class PositionEmbeddingConfig:
    name: str
    dim_model: int
    seq_len: int


Self = TypeVar("Self", bound="PositionEmbedding")


class PositionEmbedding(nn.Module):
    """Base of the position embeddings: ``forward(x)`` with x ``[B, T]`` or ``[B, T, E]``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    @classmethod
    def from_config(cls: type[Self], config: Any) -> Self:
        return cls(**{k: v for k, v in dataclasses.asdict(config).items() if v is not None})
