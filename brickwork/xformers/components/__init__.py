"""xformers' ``xformers.components``: multi-head dispatch, residual wrappers, registries and builders."""

from __future__ import annotations

from typing import Any

from brickwork.factory.xformers.stack import read_head
from brickwork.xformers.components.activations import Activation, build_activation
from brickwork.xformers.components.attention import Attention, build_attention
from brickwork.xformers.components.input_projection import InputProjection, InputProjectionConfig
from brickwork.xformers.components.multi_head_dispatch import MultiHeadDispatch, MultiHeadDispatchConfig
from brickwork.xformers.components.patch_embedding import PatchEmbeddingConfig, build_patch_embedding
from brickwork.xformers.components.residual import (
    NormalizationType,
    PostNorm,
    PreNorm,
    RequiresWrappedInputs,
    Residual,
    ResidualNormStyle,
)
from brickwork.xformers.utils import generate_matching_config


def build_multi_head_attention(
    multi_head_config: MultiHeadDispatchConfig | dict[str, Any],
) -> MultiHeadDispatch:
    """A :class:`MultiHeadDispatch` from its config. As in xformers, a dict config gains the missing
    fields (None) and its ``attention`` sub-config inherits the layer's sizes (``read_head``, the one
    reading of xformers configs) before the mechanism is built; the caller's dict is not changed."""
    if not isinstance(multi_head_config, MultiHeadDispatchConfig):
        multi_head_config = generate_matching_config(read_head(multi_head_config), MultiHeadDispatchConfig)
        if not isinstance(multi_head_config.attention, Attention):
            multi_head_config.attention = build_attention(multi_head_config.attention)
    return MultiHeadDispatch.from_config(multi_head_config)


__all__ = [
    "Activation",
    "Attention",
    "InputProjection",
    "InputProjectionConfig",
    "MultiHeadDispatch",
    "MultiHeadDispatchConfig",
    "NormalizationType",
    "PatchEmbeddingConfig",
    "PostNorm",
    "PreNorm",
    "RequiresWrappedInputs",
    "Residual",
    "ResidualNormStyle",
    "build_activation",
    "build_attention",
    "build_multi_head_attention",
    "build_patch_embedding",
]
