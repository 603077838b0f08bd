"""xformers' ``xFormerEncoderBlock`` / ``xFormerDecoderBlock``: residual wrappers around the multi-head
dispatch and the feedforward, with xformers' attribute names (``pose_encoding``, ``wrap_att``, ...)."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from brickwork.xformers.components import (
    PostNorm,
    PreNorm,
    Residual,
    ResidualNormStyle,
    build_multi_head_attention,
    build_patch_embedding,
)
from brickwork.xformers.components.feedforward import build_feedforward
from brickwork.xformers.components.patch_embedding import PatchEmbeddingConfig
from brickwork.xformers.components.positional_embedding import build_positional_embedding
from brickwork.xformers.components.residual import get_deepnorm_coefficients
from brickwork.xformers.components.simplicial_embedding import SimplicialEmbedding
from brickwork.xformers.factory.block_configs import (
    NormalizationType,
    xFormerDecoderConfig,
    xFormerEncoderConfig,
)

logger = logging.getLogger("brickwork.xformers")


def _ln_factory(config: xFormerEncoderConfig | xFormerDecoderConfig, residual: bool = True) -> Any:
    """Wraps a sublayer in the residual path and norm placement ``config.residual_norm_style`` asks for.
    DeepNorm scales the residual by the alpha of a stack of ``config.num_layers`` blocks alone (the same
    for an encoder and a decoder stack), as xformers did also in encoder-decoder models."""
    d_model, style, normalization = config.dim_model, config.residual_norm_style, config.normalization
    deepnorm = style == ResidualNormStyle.DeepNorm
    scale = get_deepnorm_coefficients(config.num_layers, 0)[0].alpha if deepnorm else None

    def wrap(sublayer: nn.Module) -> nn.Module:
        if style == ResidualNormStyle.Pre:
            normed = PreNorm(d_model, sublayer, normalization)
            return Residual(normed) if residual else normed
        return PostNorm(d_model, Residual(sublayer, scale=scale) if residual else sublayer, normalization)

    return wrap


def _position_encoding(block: nn.Module, config: Any, mha_dim: int) -> None:
    block.pose_encoding = None
    if config.position_encoding_config is not None and config.layer_position.is_first():
        block.pose_encoding = build_positional_embedding(config.position_encoding_config)
        if config.position_encoding_config.dim_model != mha_dim:
            logger.warning("the embedding and model dims differ: adding a projection")
            block.embedding_projector = nn.Linear(config.position_encoding_config.dim_model, mha_dim)


def _embed(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if block.pose_encoding is not None:
        x = block.pose_encoding(x)
        if hasattr(block, "embedding_projector"):
            x = block.embedding_projector(x)
    return x


def _masked_qkv(x: torch.Tensor, input_mask: torch.Tensor | None) -> list[torch.Tensor]:
    """xformers' ``input_mask`` ``[T]`` (or ``[B, T]``) multiplies keys and values."""
    if input_mask is None:
        return [x, x, x]
    k = x * input_mask.unsqueeze(-1)
    return [x, k, k]


class xFormerEncoderBlock(nn.Module):
    """``forward(x, att_mask=None, input_mask=None)``: ``[B, T, E]`` (or token ids / ``[B, T]`` values
    when this block embeds positions) -> ``[B, T, E]``."""

    def __init__(self, config: xFormerEncoderConfig, **_: Any) -> None:
        super().__init__()
        self.reversible_f = self.reversible_g = None
        self.residual_norm_style, self.dim_model = config.residual_norm_style, config.dim_model
        _position_encoding(self, config, config.multi_head_config["dim_model"])
        wrap = _ln_factory(config)
        mha = build_multi_head_attention(config.multi_head_config)
        feedforward = build_feedforward(config.feedforward_config)
        self.supports_attention_mask = mha.attention.supports_attention_mask
        self.requires_same_k_q_dimensions = mha.attention.requires_same_k_q_dimensions
        self.causal = getattr(mha.attention, "causal", False)
        self.wrap_att = wrap(mha)
        self.wrap_ff = wrap(feedforward)
        if config.residual_norm_style == ResidualNormStyle.Pre and config.layer_position.is_last():
            self.wrap_ff = PostNorm(config.dim_model, self.wrap_ff, normalization=config.normalization)
        self.simplicial_embedding = None
        if config.simplicial_embeddings is not None and config.layer_position.is_last():
            self.simplicial_embedding = SimplicialEmbedding(**config.simplicial_embeddings)
        self.patch_emb = None
        if config.patch_embedding_config is not None:
            self.patch_emb = build_patch_embedding(PatchEmbeddingConfig(**config.patch_embedding_config))

    @classmethod
    def from_config(cls, config: xFormerEncoderConfig) -> xFormerEncoderBlock:
        return cls(config)

    @staticmethod
    def get_reversible_layer(config: xFormerEncoderConfig) -> tuple[nn.Module, nn.Module]:
        """The (f, g) halves of a reversible block: normed attention and normed feedforward."""
        wrap = _ln_factory(config, residual=False)
        mha = build_multi_head_attention(config.multi_head_config)
        feedforward = build_feedforward(config.feedforward_config)
        return wrap(mha), wrap(feedforward)

    def forward(
        self, x: torch.Tensor, att_mask: Any = None, input_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.patch_emb is not None:
            x = self.patch_emb(x)
        x = _embed(self, x)
        x = self.wrap_att(inputs=_masked_qkv(x, input_mask), att_mask=att_mask)
        x = self.wrap_ff(inputs=[x])
        return x if self.simplicial_embedding is None else self.simplicial_embedding(x)


class xFormerDecoderBlock(nn.Module):
    """``forward(target, memory, encoder_att_mask=None, decoder_att_mask=None, input_mask=None)``:
    masked self-attention, cross-attention on ``memory``, feedforward."""

    def __init__(self, config: xFormerDecoderConfig, **_: Any) -> None:
        super().__init__()
        _position_encoding(self, config, config.multi_head_config_masked["dim_model"])
        wrap = _ln_factory(config)
        mha = build_multi_head_attention(config.multi_head_config_masked)
        cross_mha = build_multi_head_attention(config.multi_head_config_cross)
        feedforward = build_feedforward(config.feedforward_config)
        self.supports_attention_mask = mha.attention.supports_attention_mask
        self.requires_same_k_q_dimensions = mha.attention.requires_same_k_q_dimensions
        self.requires_squared_context_length = (
            feedforward.requires_squared_context or mha.attention.requires_squared_context
        )
        self.causal_attention = getattr(mha.attention, "causal", False)
        self.wrap_att, self.wrap_cross, self.wrap_ff = wrap(mha), wrap(cross_mha), wrap(feedforward)
        if config.residual_norm_style == ResidualNormStyle.Pre and config.layer_position.is_last():
            self.wrap_ff = PostNorm(config.dim_model, self.wrap_ff, normalization=NormalizationType.LayerNorm)

    @classmethod
    def from_config(cls, config: xFormerDecoderConfig) -> xFormerDecoderBlock:
        return cls(config)

    def forward(
        self,
        target: torch.Tensor,
        memory: torch.Tensor,
        encoder_att_mask: Any = None,
        decoder_att_mask: Any = None,
        input_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        target = _embed(self, target)
        x = self.wrap_att(inputs=_masked_qkv(target, input_mask), att_mask=decoder_att_mask)
        x = self.wrap_cross(inputs=[x, memory, memory], att_mask=encoder_att_mask)
        return self.wrap_ff(inputs=[x])
