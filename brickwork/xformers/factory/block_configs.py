"""xformers' block configs. As in xformers, each sub-config keeps the keys its component declares and
ignores the rest (one dict may configure every mechanism), and missing keys are None (defaults)."""

from __future__ import annotations

import dataclasses
from enum import Enum, IntFlag
from typing import Any

from brickwork.factory.xformers.stack import RENAMED_BLOCK_KEYS, read_stack
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


@dataclasses.dataclass(init=False)
class xFormerBlockConfig:
    """One stack's config, read by brickwork's one reading of xformers configs
    (``brickwork.factory.xformers.stack.read_stack``): a left-out or None key takes xformers' default
    (post-norm, layernorm, one layer, not reversible) and each sub-config the block's ``dim_model``."""

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
        block_type: BlockType | str,
        residual_norm_style: ResidualNormStyle | str | None = None,
        normalization: NormalizationType | str | None = None,
        reversible: bool | None = None,
        num_layers: int | None = None,
        layer_position: LayerPosition | None = None,
        **options: Any,
    ) -> None:
        """``options``: a subclass's own keys (its ``multi_head_config``, ...) and older key names."""
        unknown = set(options) - {f.name for f in dataclasses.fields(self)} - set(RENAMED_BLOCK_KEYS)
        if unknown:
            raise TypeError(f"{type(self).__name__} got unexpected keyword arguments {sorted(unknown)}")
        given = dict(
            dim_model=dim_model, feedforward_config=feedforward_config, block_type=block_type,
            position_encoding_config=position_encoding_config, residual_norm_style=residual_norm_style,
            normalization=normalization, reversible=reversible, num_layers=num_layers, **options,
        )  # fmt: skip
        vars(self).update(read_stack(given, ""))
        self.block_type = BlockType(self.block_type)
        self.residual_norm_style = ResidualNormStyle(self.residual_norm_style)
        self.normalization = NormalizationType(self.normalization)
        self.feedforward_config = generate_matching_config(
            self.feedforward_config, FEEDFORWARD_REGISTRY[self.feedforward_config["name"]].config
        )
        if self.position_encoding_config is not None:
            self.position_encoding_config = generate_matching_config(
                self.position_encoding_config,
                POSITION_EMBEDDING_REGISTRY[self.position_encoding_config["name"]].config,
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
        residual_norm_style: ResidualNormStyle | str | None = None,
        normalization: NormalizationType | str | None = None,
        use_triton: bool = True,
        simplicial_embeddings: dict[str, Any] | None = None,
        patch_embedding_config: dict[str, Any] | None = None,
        block_type: BlockType | str = BlockType.Encoder,
        **kwargs: Any,
    ) -> None:
        require(BlockType(block_type) == BlockType.Encoder, "an encoder config has block_type 'encoder'")
        super().__init__(
            dim_model, feedforward_config, position_encoding_config, block_type,
            residual_norm_style, normalization, multi_head_config=multi_head_config, use_triton=use_triton,
            simplicial_embeddings=simplicial_embeddings, patch_embedding_config=patch_embedding_config,
            **kwargs,
        )  # fmt: skip


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
        residual_norm_style: ResidualNormStyle | str | None = None,
        normalization: NormalizationType | str | None = None,
        use_triton: bool = True,
        block_type: BlockType | str = BlockType.Decoder,
        **kwargs: Any,
    ) -> None:
        require(BlockType(block_type) == BlockType.Decoder, "a decoder config has block_type 'decoder'")
        super().__init__(
            dim_model, feedforward_config, position_encoding_config, block_type,
            residual_norm_style, normalization, multi_head_config_masked=multi_head_config_masked,
            multi_head_config_cross=multi_head_config_cross, use_triton=use_triton, **kwargs,
        )  # fmt: skip
