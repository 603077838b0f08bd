"""xformers' position-embedding registry (``sine``, ``vocab``, ``learnable``) and ``RotaryEmbedding``."""

from __future__ import annotations

from brickwork.xformers.components.positional_embedding.base import PositionEmbedding, PositionEmbeddingConfig
from brickwork.xformers.utils import make_registry

(
    POSITION_EMBEDDING_REGISTRY,
    POSITION_EMBEDDING_CLASS_NAMES,
    register_positional_embedding,
    build_positional_embedding,
) = make_registry(PositionEmbedding, PositionEmbeddingConfig)


from brickwork.xformers.components.positional_embedding.embeddings import (  # noqa: E402
    LearnablePositionalEmbedding,
    LearnablePositionalEmbeddingConfig,
    SinePositionalEmbedding,
    VocabEmbedding,
    VocabEmbeddingConfig,
)
from brickwork.xformers.components.positional_embedding.rotary import RotaryEmbedding  # noqa: E402

register_positional_embedding("sine", PositionEmbeddingConfig)(SinePositionalEmbedding)
register_positional_embedding("vocab", VocabEmbeddingConfig)(VocabEmbedding)
register_positional_embedding("learnable", LearnablePositionalEmbeddingConfig)(LearnablePositionalEmbedding)

__all__ = [
    "POSITION_EMBEDDING_REGISTRY",
    "LearnablePositionalEmbedding",
    "PositionEmbedding",
    "PositionEmbeddingConfig",
    "RotaryEmbedding",
    "SinePositionalEmbedding",
    "VocabEmbedding",
    "build_positional_embedding",
    "register_positional_embedding",
]
