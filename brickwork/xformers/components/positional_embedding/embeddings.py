"""xformers' ``sine``, ``vocab`` and ``learnable`` embeddings on brickwork's positional encodings."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from brickwork.components.positional import LearnedPositionalEmbedding, SinePositionalEncoding
from brickwork.xformers.components.positional_embedding.base import PositionEmbedding, PositionEmbeddingConfig


def _features(x: torch.Tensor, dim_model: int) -> torch.Tensor:
    """A ``[B, T]`` input (one value per position, as xformers allowed) broadcast to ``[B, T, dim_model]``."""
    return x.unsqueeze(-1).expand(*x.shape, dim_model).float() if x.ndim == 2 else x


class SinePositionalEmbedding(PositionEmbedding):
    """x plus the fixed sine table (brickwork ``sine``)."""

    def __init__(self, dim_model: int, *_: Any, **__: Any) -> None:
        super().__init__()
        self.dim_model = dim_model
        self.encoding = SinePositionalEncoding(dim_model=dim_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x ``[B, T]`` or ``[B, T, dim_model]`` -> ``[B, T, dim_model]``."""
        return self.encoding(_features(x, self.dim_model))


@dataclasses.dataclass
class VocabEmbeddingConfig(PositionEmbeddingConfig):
    vocab_size: int
    dropout: float


class VocabEmbedding(PositionEmbedding):
    """Token embedding plus a learned position table (brickwork ``learned``), then dropout."""

    def __init__(
        self, dim_model: int, seq_len: int, vocab_size: int, dropout: float = 0.0, *_: Any, **__: Any
    ) -> None:
        super().__init__()
        self.vocab_size, self.dim_model = vocab_size, dim_model
        self.dropout = nn.Dropout(p=dropout)
        self.word_embeddings = nn.Embedding(vocab_size, dim_model)
        self.position_embeddings = LearnedPositionalEmbedding(max_seq_len=seq_len, dim_model=dim_model)
        self.init_weights()

    def init_weights(self, gain: float = 1.0) -> None:
        nn.init.normal_(self.position_embeddings.weight, std=0.02 * gain)
        nn.init.normal_(self.word_embeddings.weight, std=0.02 * gain)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids ``[B, T]`` -> ``[B, T, dim_model]``."""
        return self.dropout(self.position_embeddings(self.word_embeddings(x)))


@dataclasses.dataclass
class LearnablePositionalEmbeddingConfig(PositionEmbeddingConfig):
    add_class_token: bool


class LearnablePositionalEmbedding(PositionEmbedding):
    """x plus a learned table (brickwork ``learned``), after an optional prepended class token."""

    def __init__(
        self, seq_len: int, dim_model: int, add_class_token: bool = False, *_: Any, **__: Any
    ) -> None:
        super().__init__()
        self.dim_model = dim_model
        self.positions = LearnedPositionalEmbedding(
            max_seq_len=seq_len + int(add_class_token), dim_model=dim_model
        )
        self.class_token = nn.Parameter(torch.zeros(dim_model)) if add_class_token else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x ``[B, T]`` or ``[B, T, dim_model]`` -> ``[B, T (+1), dim_model]``."""
        x = _features(x, self.dim_model)
        if self.class_token is not None:
            x = torch.cat([self.class_token.expand(x.shape[0], 1, -1).to(x.dtype), x], dim=1)
        return self.positions(x)
