"""xformers' helper for hierarchical (PoolFormer / Swin-like) stacks: each stage embeds patches anew,
trading sequence length for width."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from brickwork.xformers._compat import require
from brickwork.xformers.components.residual import ResidualNormStyle


@dataclasses.dataclass
class BasicLayerConfig:
    embedding: int
    attention_mechanism: str
    patch_size: int
    stride: int
    padding: int
    seq_len: int
    feedforward: str
    normalization: str = "layernorm"
    repeat_layer: int = 1


def get_hierarchical_configuration(
    layer_base_configs: list[BasicLayerConfig],
    residual_norm_style: ResidualNormStyle | str = ResidualNormStyle.Pre,
    use_rotary_embeddings: bool = True,
    mlp_multiplier: int = 4,
    in_channels: int = 3,
    dim_head: int | None = None,
) -> list[dict[str, Any]]:
    """One encoder stack config per stage (plus ``repeat_layer - 1`` copies without patch embedding)."""
    configs: list[dict[str, Any]] = []
    for base in layer_base_configs:
        heads = 1
        if dim_head is not None:
            require(
                base.embedding % dim_head == 0,
                f"embedding {base.embedding} is not divisible by dim_head {dim_head}",
            )
            heads = base.embedding // dim_head
        layer = {
            "block_type": "encoder",
            "dim_model": base.embedding,
            "use_triton": False,
            "normalization": base.normalization,
            "residual_norm_style": ResidualNormStyle(residual_norm_style).value,
            "multi_head_config": {
                "num_heads": heads,
                "use_rotary_embeddings": use_rotary_embeddings,
                "attention": {"name": base.attention_mechanism},
            },
            "feedforward_config": {
                "name": base.feedforward,
                "activation": "gelu",
                "hidden_layer_multiplier": mlp_multiplier,
                "dropout": 0.0,
            },
            "position_encoding_config": {
                "name": "learnable",
                "seq_len": base.seq_len,
                "add_class_token": False,
            },
            "patch_embedding_config": {
                "in_channels": in_channels,
                "kernel_size": base.patch_size,
                "stride": base.stride,
                "padding": base.padding,
            },
        }
        in_channels = base.embedding
        configs.append(layer)
        repeat = {key: value for key, value in layer.items() if key != "patch_embedding_config"}
        configs += [copy.deepcopy(repeat) for _ in range(base.repeat_layer - 1)]
    return configs
