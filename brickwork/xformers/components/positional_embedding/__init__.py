"""xformers' position-embedding registry (``sine``, ``vocab``, ``learnable``) and ``RotaryEmbedding``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from brickwork.xformers.components.positional_embedding.base import PositionEmbedding, PositionEmbeddingConfig
from brickwork.xformers.utils import generate_matching_config, get_registry_decorator

POSITION_EMBEDDING_REGISTRY: dict[str, Any] = {}
POSITION_EMBEDDING_CLASS_NAMES: set[str] = set()

register_positional_embedding: Callable[..., Callable[[type], type]] = get_registry_decorator(
    POSITION_EMBEDDING_REGISTRY, POSITION_EMBEDDING_CLASS_NAMES, PositionEmbedding, PositionEmbeddingConfig
)


def build_positional_embedding(config: dict[str, Any] | PositionEmbeddingConfig) -> PositionEmbedding:
    """The embedding registered as ``config["name"]``; keys its config does not declare are ignored."""
    if not isinstance(config, PositionEmbeddingConfig):
        config = generate_matching_config(config, POSITION_EMBEDDING_REGISTRY[config["name"]].config)
    return POSITION_EMBEDDING_REGISTRY[config.name].constructor.from_config(config)


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
