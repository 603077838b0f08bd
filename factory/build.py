"""``build_model`` / ``build_block``: from a spec (dict or .yaml/.json path) to ``nn.Module``.

The spec is checked first (``resolve``), so a bad spec fails before any weight is allocated. The
model is built, then initialised by the spec's ``init`` scheme from torch's global RNG: the same seed
gives the same weights. The resolved spec is attached as ``model.spec``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from torch import nn

from brickwork.blocks import (
    Block,
    DecoderLM,
    Encoder,
    EncoderDecoder,
    ImageEncoder,
    MaskedLMHead,
    PatchEmbedding,
)
from brickwork.blocks.reversible import ReversibleLayers
from brickwork.components.attention import MultiHeadAttention
from brickwork.components.residual import DeepNormResidual, deepnorm_init_
from brickwork.errors import ConfigError, join_path
from brickwork.factory.convert import construct
from brickwork.factory.memory_estimate import check_fits_in_memory
from brickwork.factory.overrides import apply_overrides
from brickwork.factory.presets import get_preset
from brickwork.factory.resolve import ModelConfig, resolve_block_spec, resolve_model_spec
from brickwork.factory.resolve_block import AttentionConfig, BlockConfig, position_kind
from brickwork.factory.schema import ImageEncoderSpec
from brickwork.factory.spec_io import load_spec

SpecSource = Mapping[str, Any] | str | os.PathLike[str]


def read_spec(spec: SpecSource, overrides: Iterable[str] | Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A private copy of ``spec`` (loaded when it is a path, looked up when it is a preset name) with
    ``overrides`` applied."""
    if isinstance(spec, str) and not Path(spec).suffix and not Path(spec).exists():
        spec = get_preset(spec)  # a name without a file suffix: ConfigError lists the presets
    elif isinstance(spec, (str, os.PathLike)):
        spec = load_spec(spec)
    elif not isinstance(spec, Mapping):
        raise ConfigError(f"a spec must be a mapping or a .yaml/.json path, got {type(spec).__name__}")
    if overrides:
        return apply_overrides(spec, overrides, validate=False)
    return copy.deepcopy(dict(spec))


def build_model(spec: SpecSource, overrides: Iterable[str] | Mapping[str, Any] | None = None) -> nn.Module:
    """Build the model a spec describes; ``overrides`` are dotted ``key=value`` strings (see apply_overrides).

    ``spec`` is a dict, a .yaml/.json path, or a preset name (``build_model("gpt-tiny")``).

    Returns a ``DecoderLM``, ``Encoder``, ``EncoderDecoder`` or ``ImageEncoder`` carrying ``.spec``.
    """
    config = resolve_model_spec(read_spec(spec, overrides))
    check_fits_in_memory(lambda: instantiate_model(config))
    model = instantiate_model(config)
    initialise(model, config)
    model.spec = copy.deepcopy(config.spec)
    return model


def build_block(spec: SpecSource, overrides: Iterable[str] | Mapping[str, Any] | None = None) -> nn.Module:
    """Build one :class:`~brickwork.blocks.Block` from a block spec; it carries ``.spec``."""
    config = resolve_block_spec(read_spec(spec, overrides))
    block = instantiate_block(config.block, config.dim_model)
    block.spec = copy.deepcopy(config.spec)
    return block


def instantiate_attention(config: AttentionConfig, dim_model: int) -> MultiHeadAttention:
    hooks: dict[str, nn.Module] = {}
    for choice in config.positions:
        hooks["rotary" if position_kind(choice.cls) == "rotary" else "position_bias"] = choice.build()
    spec = config.spec
    try:
        return MultiHeadAttention(
            dim_model=dim_model,
            num_heads=spec.num_heads,
            attention=config.mechanism.cls,
            causal=config.causal,
            num_kv_heads=spec.num_kv_heads,
            bias=spec.bias,
            fused_qkv=spec.fused_qkv,
            dropout=spec.dropout,
            attention_options=config.mechanism.options(include_fixed=False),
            dim_head=spec.dim_head,
            **hooks,
        )
    except ConfigError as err:
        # The layer names its mechanism's options ``attention_options``; the spec calls them ``mechanism``.
        inner = err.path.replace("attention_options", "mechanism", 1)
        raise ConfigError(err.reason, join_path(config.path, inner), err.choices, err.got) from None
    except (ValueError, TypeError) as err:
        raise ConfigError(str(err), config.path) from err


def instantiate_block(config: BlockConfig, dim_model: int) -> Block:
    cross = None
    if config.cross_attention is not None:
        cross = instantiate_attention(config.cross_attention, dim_model)
    return construct(
        Block,
        config.path,
        attention=instantiate_attention(config.attention, dim_model),
        feedforward=config.feedforward.build(),
        norm=config.norm.partial(),
        residual=config.residual.build(),
        cross_attention=cross,
    )


def instantiate_model(config: ModelConfig) -> nn.Module:
    f = config.fields
    dim = f.dim_model
    layers = {}
    for name, stack in config.stacks.items():
        blocks = [instantiate_block(b, dim) for b in stack.layers]
        layers[name] = ReversibleLayers(blocks) if stack.reversible else blocks
    position = config.position.build() if config.position is not None else None

    def final_norm(stack: str) -> nn.Module | None:
        return config.stacks[stack].block.norm.build() if f.final_norm else None

    if config.kind == "decoder_lm":
        return construct(
            DecoderLM,
            "",
            vocab_size=f.vocab_size,
            layers=layers["decoder"],
            position=position,
            final_norm=final_norm("decoder"),
            tie_embeddings=f.tie_embeddings,
            dropout=f.dropout,
            max_seq_len=f.max_seq_len,
        )
    if config.kind == "encoder_decoder":
        return construct(
            EncoderDecoder,
            "",
            vocab_size=f.vocab_size,
            encoder_layers=layers["encoder"],
            decoder_layers=layers["decoder"],
            position=position,
            encoder_final_norm=final_norm("encoder"),
            decoder_final_norm=final_norm("decoder"),
            tie_embeddings=f.tie_embeddings,
            dropout=f.dropout,
        )
    norm = config.stacks["encoder"].block.norm
    if isinstance(f, ImageEncoderSpec):
        patches = PatchEmbedding(f.image_size, f.patch_size, f.channels, dim)
        return construct(
            ImageEncoder,
            "",
            patch_embedding=patches,
            layers=layers["encoder"],
            position=position,
            class_token=f.class_token,
            final_norm=final_norm("encoder"),
            num_classes=f.num_classes,
            pool=f.pool,
            dropout=f.dropout,
        )
    return construct(
        Encoder, "", vocab_size=f.vocab_size, layers=layers["encoder"], position=position,
        type_vocab_size=f.type_vocab_size, embedding_norm=norm.build() if f.embedding_norm else None,
        final_norm=final_norm("encoder"),
        mlm_head=(
            MaskedLMHead(dim, f.vocab_size, norm.build(), f.head_activation) if f.head == "mlm" else None
        ),
        pooler=f.pooler, dropout=f.dropout, tie_embeddings=f.tie_embeddings,
    )  # fmt: skip


def initialise(model: nn.Module, config: ModelConfig) -> None:
    """Apply the spec's init scheme, then DeepNet's down-scaling of the branches in deepnorm blocks."""
    depth = max(len(stack.layers) for stack in config.stacks.values())
    config.init.build().apply(model, depth)
    for module in model.modules():
        residual = getattr(module, "residual", None)
        if isinstance(residual, DeepNormResidual) and residual.beta != 1.0:
            deepnorm_init_(module, residual.beta)
