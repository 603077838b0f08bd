"""xformers' attention registry (name -> ``Item(constructor, config)``), ``build_attention`` and types."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from brickwork.factory.xformers.stack import XFORMERS_MECHANISMS
from brickwork.xformers.components.attention._sputnik_sparse import SparseCS
from brickwork.xformers.components.attention.attention_mask import AttentionMask
from brickwork.xformers.components.attention.base import Attention, AttentionConfig
from brickwork.xformers.utils import make_registry

logger = logging.getLogger("brickwork.xformers")

ATTENTION_REGISTRY, ATTENTION_CLASS_NAMES, register_attention, _build = make_registry(
    Attention, AttentionConfig
)

# Patterns denser than this stay dense masks (the threshold xformers took from the Sputnik paper).
_DENSITY_THRESHOLD = 0.30
_USE_SPUTNIK = True


def build_attention(config: dict[str, Any] | AttentionConfig) -> Attention:
    """The attention registered as ``config["name"]``, from the config keys its class declares (others
    are ignored, as in xformers, where one dict configures every mechanism)."""
    if not isinstance(config, AttentionConfig) and config["name"] not in ATTENTION_REGISTRY:
        logger.warning(f"{config['name']} not available among {sorted(ATTENTION_REGISTRY)}")
        raise KeyError(config["name"])
    return _build(config)


def sparsify(matrix: torch.Tensor) -> SparseCS | torch.Tensor:
    return SparseCS(matrix) if _USE_SPUTNIK else matrix.to_sparse()


def maybe_sparsify(matrix: torch.Tensor) -> Any:
    """A dense :class:`AttentionMask` above the density threshold, a sparse pattern below it."""
    if torch.count_nonzero(matrix).item() / matrix.numel() > _DENSITY_THRESHOLD:
        return AttentionMask.from_bool(matrix)
    return sparsify(matrix)


from brickwork.xformers.components.attention.compositional import CompositionalAttention  # noqa: E402
from brickwork.xformers.components.attention.mechanisms import (  # noqa: E402
    FavorAttention,
    FourierMix,
    GlobalAttention,
    LambdaLayer,
    LinformerAttention,
    LocalAttention,
    NystromAttention,
    OrthoFormerAttention,
    Pooling,
    RandomAttention,
    ScaledDotProduct,
    VisualAttention,
)

for _name, _cls in (
    ("scaled_dot_product", ScaledDotProduct), ("favor", FavorAttention), ("global", GlobalAttention),
    ("local", LocalAttention), ("random", RandomAttention), ("linformer", LinformerAttention),
    ("nystrom", NystromAttention), ("orthoformer", OrthoFormerAttention), ("lambda", LambdaLayer),
    ("pooling", Pooling), ("visual", VisualAttention), ("fourier_mix", FourierMix),
    ("compositional", CompositionalAttention),
):  # fmt: skip
    # The config class declares the keys xformers' did (the one table of them, beside the reading of
    # xformers configs); each is None when a config leaves it out.
    _fields = [(key, Any, dataclasses.field(default=None)) for key in XFORMERS_MECHANISMS[_name]]
    register_attention(
        _name, dataclasses.make_dataclass(f"{_cls.__name__}Config", _fields, bases=(AttentionConfig,))
    )(_cls)

__all__ = [
    "ATTENTION_REGISTRY",
    "Attention",
    "AttentionConfig",
    "AttentionMask",
    "CompositionalAttention",
    "FavorAttention",
    "FourierMix",
    "GlobalAttention",
    "LambdaLayer",
    "LinformerAttention",
    "LocalAttention",
    "NystromAttention",
    "OrthoFormerAttention",
    "Pooling",
    "RandomAttention",
    "ScaledDotProduct",
    "SparseCS",
    "VisualAttention",
    "build_attention",
    "maybe_sparsify",
    "register_attention",
    "sparsify",
]
