"""xformers' block configs. As in xformers, each sub-config keeps the keys its component declares and
ignores the rest (one dict may configure every mechanism), and missing keys are None (defaults)."""

from __future__ import annotations

import dataclasses
from enum import Enum, IntFlag
from typing import Any

from brickwork.xformers._compat import require
from brickwork.xformers.components import NormalizationType, ResidualNormStyle
from brickwork.xformers.components.feedforward import FEEDFORWARD_REGISTRY
from brickwork.xformers.components.positional_embedding import POSITION_EMBEDDING_REGISTRY
from brickwork.xformers.utils import generate_matching_config


class LayerPositionBitmask(IntFlag):
    First = 0b01
    Last = 0b10
    Default = 0b11


class LayerPosition:
    """Whether a layer is the first and/or the last of the model (position encoding, final norm)."""

    def __init__(self) -> None:
        self.bitmask = LayerPositionBitmask.Default

    def is_first(self) -> bool:
        return bool(self.bitmask & LayerPositionBitmask.First)

    def is_last(self) -> bool:
        return bool(self.bitmask & LayerPositionBitmask.Last)

    def mark_not_first(self) -> None:
        self.bitmask &= ~LayerPositionBitmask.First

    def mark_not_last(self) -> None:
        self.bitmask &= ~LayerPositionBitmask.Last


class BlockType(str, Enum):
    Encoder = "encoder"
    Decoder = "decoder"


def _with_dim(cfg: dict[str, Any] | None, key: str, value: Any) -> dict[str, Any] | None:
    """A copy of ``cfg`` with ``key`` filled in when absent (the caller's dict is left alone)."""
    if cfg is None or not isinstance(cfg, dict):
        return cfg
    return {key: value, **cfg}


@dataclasses.dataclass(init=False)
class xFormerBlockConfig:
    dim_model: int
    feedforward_config: Any
    position_encoding_config: Any
    block_type: BlockType
    residual_norm_style: ResidualNormStyle
    normalization: NormalizationType
    layer_position: LayerPosition
    use_triton: bool
    reversible: bool
    num_layers: int

    def __init__(
        self,
        dim_model: int,
        feedforward_config: dict[str, Any],
        position_encoding_config: dict[str, Any] | None,
        block_type: BlockType,
        residual_norm_style: ResidualNormStyle = ResidualNormStyle.Post,
        normalization: NormalizationType = NormalizationType.LayerNorm,
        reversible: bool = False,
        num_layers: int = 1,
        layer_position: LayerPosition | None = None,
    ) -> None:
        self.dim_model, self.block_type = dim_model, block_type
        self.residual_norm_style = ResidualNormStyle(residual_norm_style)
        self.normalization = NormalizationType(normalization)
        self.reversible, self.num_layers = reversible, num_layers
        self.feedforward_config = generate_matching_config(
            feedforward_config, FEEDFORWARD_REGISTRY[feedforward_config["name"]].config
        )
        self.position_encoding_config = None
        if position_encoding_config is not None:
            self.position_encoding_config = generate_matching_config(
                position_encoding_config, POSITION_EMBEDDING_REGISTRY[position_encoding_config["name"]].config
            )
        self.layer_position = layer_position or LayerPosition()


@dataclasses.dataclass(init=False)
class xFormerEncoderConfig(xFormerBlockConfig):
    multi_head_config: dict[str, Any]
    use_triton: bool
    simplicial_embeddings: dict[str, Any] | None
    patch_embedding_config: dict[str, Any] | None

    def __init__(
        self,
        dim_model: int,
        feedforward_config: dict[str, Any],
        multi_head_config: dict[str, Any],
        position_encoding_config: dict[str, Any] | None = None,
        residual_norm_style: str = "post",
        normalization: NormalizationType | str = NormalizationType.LayerNorm,
        use_triton: bool = True,
        simplicial_embeddings: dict[str, Any] | None = None,
        patch_embedding_config: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        require(
            kwargs.pop("block_type", "encoder") == "encoder", "an encoder config has block_type 'encoder'"
        )
        super().__init__(
            dim_model=dim_model,
            feedforward_config=_with_dim(feedforward_config, "dim_model", dim_model),
            position_encoding_config=_with_dim(position_encoding_config, "dim_model", dim_model),
            block_type=BlockType.Encoder,
            residual_norm_style=residual_norm_style,
            normalization=normalization,
            **kwargs,
        )
        self.multi_head_config = _with_dim(multi_head_config, "dim_model", dim_model)
        self.use_triton = use_triton
        self.simplicial_embeddings = simplicial_embeddings
        self.patch_embedding_config = _with_dim(patch_embedding_config, "out_channels", dim_model)


@dataclasses.dataclass(init=False)
class xFormerDecoderConfig(xFormerBlockConfig):
    multi_head_config_masked: dict[str, Any]
    multi_head_config_cross: dict[str, Any]

    def __init__(
        self,
        dim_model: int,
        feedforward_config: dict[str, Any],
        multi_head_config_masked: dict[str, Any],
        multi_head_config_cross: dict[str, Any],
        position_encoding_config: dict[str, Any] | None = None,
        residual_norm_style: str = "post",
        normalization: NormalizationType | str = NormalizationType.LayerNorm,
        use_triton: bool = True,
        **kwargs: Any,
    ) -> None:
        require(kwargs.pop("block_type", "decoder") == "decoder", "a decoder config has block_type 'decoder'")
        super().__init__(
            dim_model=dim_model,
            feedforward_config=_with_dim(feedforward_config, "dim_model", dim_model),
            position_encoding_config=_with_dim(position_encoding_config, "dim_model", dim_model),
            block_type=BlockType.Decoder,
            residual_norm_style=residual_norm_style,
            normalization=normalization,
            **kwargs,
        )
        self.multi_head_config_masked = _with_dim(multi_head_config_masked, "dim_model", dim_model)
        self.multi_head_config_cross = _with_dim(multi_head_config_cross, "dim_model", dim_model)
        self.use_triton = use_triton
