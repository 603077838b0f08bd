"""xformers' attention registry (name -> ``Item(constructor, config)``), ``build_attention`` and types."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import torch

from brickwork.xformers.components.attention._sputnik_sparse import SparseCS
from brickwork.xformers.components.attention.attention_mask import AttentionMask
from brickwork.xformers.components.attention.base import Attention, AttentionConfig
from brickwork.xformers.utils import generate_matching_config, get_registry_decorator

logger = logging.getLogger("brickwork.xformers")

ATTENTION_REGISTRY: dict[str, Any] = {}
ATTENTION_CLASS_NAMES: set[str] = set()

# Patterns denser than this stay dense masks (the threshold xformers took from the Sputnik paper).
_DENSITY_THRESHOLD = 0.30
_USE_SPUTNIK = True

register_attention: Callable[..., Callable[[type], type]] = get_registry_decorator(
    ATTENTION_REGISTRY, ATTENTION_CLASS_NAMES, Attention, AttentionConfig
)


def build_attention(config: dict[str, Any] | AttentionConfig) -> Attention:
    """The attention registered as ``config["name"]``, from the config keys its class declares (others
    are ignored, as in xformers, where one dict configures every mechanism)."""
    if not isinstance(config, AttentionConfig):
        name = config["name"]
        if name not in ATTENTION_REGISTRY:
            logger.warning(f"{name} not available among {sorted(ATTENTION_REGISTRY)}")
            raise KeyError(name)
        config = generate_matching_config(config, ATTENTION_REGISTRY[name].config)
    return ATTENTION_REGISTRY[config.name].constructor.from_config(config)


def sparsify(matrix: torch.Tensor) -> SparseCS | torch.Tensor:
    return SparseCS(matrix) if _USE_SPUTNIK else matrix.to_sparse()


def maybe_sparsify(matrix: torch.Tensor) -> Any:
    """A dense :class:`AttentionMask` above the density threshold, a sparse pattern below it."""
    if torch.count_nonzero(matrix).item() / matrix.numel() > _DENSITY_THRESHOLD:
        return AttentionMask.from_bool(matrix)
    return sparsify(matrix)


def _config(name: str, **fields: Any) -> type:
    """A config dataclass named like xformers' for mechanism ``name``."""
    spec = [(key, kind, dataclasses.field(default=None)) for key, kind in fields.items()]
    return dataclasses.make_dataclass(name, spec, bases=(AttentionConfig,))


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

ScaledDotProductConfig = _config("ScaledDotProductConfig", causal=Any, seq_len=Any, to_seq_len=Any)
FavorAttentionConfig = _config(
    "FavorAttentionConfig", causal=Any, dim_features=Any, dim_head=Any, iter_before_redraw=Any,
    feature_map_type=Any, normalize_inputs=Any,
)  # fmt: skip
GlobalAttentionConfig = _config(
    "GlobalAttentionConfig", attention_query_mask=Any, causal=Any, force_sparsity=Any
)
LocalAttentionConfig = _config("LocalAttentionConfig", causal=Any, window_size=Any, force_sparsity=Any)
RandomAttentionConfig = _config(
    "RandomAttentionConfig", causal=Any, r=Any, constant_masking=Any, force_sparsity=Any
)
LinformerSelfAttentionConfig = _config("LinformerSelfAttentionConfig", seq_len=Any, k=Any)
NystromSelfAttentionConfig = _config(
    "NystromSelfAttentionConfig", num_heads=Any, num_landmarks=Any, landmark_pooling=Any, causal=Any,
    pinverse_original_init=Any, inv_iterations=Any, v_skip_connection=Any, conv_kernel_size=Any,
    use_razavi_pinverse=Any,
)  # fmt: skip
OrthoformerAttentionConfig = _config(
    "OrthoformerAttentionConfig", num_landmarks=Any, subsample_fraction=Any, landmark_selection=Any
)
LambdaLayerConfig = _config("LambdaLayerConfig", seq_len=Any, dim_head=Any)
PoolingAttentionConfig = _config("PoolingAttentionConfig", pool_size=Any, stride=Any, padding=Any)
VisualAttentionConfig = _config("VisualAttentionConfig", dim_model=Any)
CompositionalAttentionConfig = _config(
    "CompositionalAttentionConfig", dim_model=Any, num_heads=Any, dim_attn=Any, num_rules=Any, dim_key=Any,
    dim_value=Any, dim_selection=Any, qk_rule=Any, nonlinear=Any, q_compose=Any, bias=Any, causal=Any,
    in_proj_container=Any, use_separate_proj_weight=Any,
)  # fmt: skip

for _name, _cls, _cfg in (
    ("scaled_dot_product", ScaledDotProduct, ScaledDotProductConfig),
    ("favor", FavorAttention, FavorAttentionConfig),
    ("global", GlobalAttention, GlobalAttentionConfig),
    ("local", LocalAttention, LocalAttentionConfig),
    ("random", RandomAttention, RandomAttentionConfig),
    ("linformer", LinformerAttention, LinformerSelfAttentionConfig),
    ("nystrom", NystromAttention, NystromSelfAttentionConfig),
    ("orthoformer", OrthoFormerAttention, OrthoformerAttentionConfig),
    ("lambda", LambdaLayer, LambdaLayerConfig),
    ("pooling", Pooling, PoolingAttentionConfig),
    ("visual", VisualAttention, VisualAttentionConfig),
    ("fourier_mix", FourierMix, AttentionConfig),
    ("compositional", CompositionalAttention, CompositionalAttentionConfig),
):
    register_attention(_name, _cfg)(_cls)

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
