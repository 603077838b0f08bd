"""Checking one block spec (attention, feedforward, norm, residual) into typed configs.

The checks that span several keys live here, each naming every key involved: dim_model against
num_heads, num_heads against num_kv_heads, rotary positions against the head size, causal decoders
against mechanisms without a causal form, cross-attention against fused projections.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from brickwork.components.attention import ATTENTION_REGISTRY
from brickwork.components.feedforward import FEEDFORWARD_REGISTRY
from brickwork.components.positional import POSITIONAL_REGISTRY, ALiBi, RotaryEmbedding
from brickwork.components.residual import NORM_REGISTRY, RESIDUAL_REGISTRY
from brickwork.errors import ConfigError, join_path
from brickwork.factory.choice import Choice, options_dataclass, resolve_choice
from brickwork.factory.convert import config_fields, config_to_dict, to_config
from brickwork.factory.schema import AttentionSpec, BlockSpec, CrossBlockSpec


@dataclass(frozen=True)
class AttentionConfig:
    spec: AttentionSpec
    mechanism: Choice
    causal: bool
    dim_head: int
    path: str
    positions: tuple[Choice, ...] = ()

    def to_spec(self) -> dict[str, Any]:
        out = config_to_dict(self.spec)
        out["mechanism"] = self.mechanism.to_spec()
        return out


@dataclass(frozen=True)
class BlockConfig:
    """A checked block: ``kind`` is "encoder" or "decoder" (causal self-attention)."""

    kind: str
    attention: AttentionConfig
    feedforward: Choice
    norm: Choice
    residual: Choice
    path: str
    cross_attention: AttentionConfig | None = None

    def to_spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {"attention": self.attention.to_spec()}
        if self.cross_attention is not None:
            out["cross_attention"] = self.cross_attention.to_spec()
        out["feedforward"] = self.feedforward.to_spec()
        out["norm"] = self.norm.to_spec()
        out["residual"] = self.residual.to_spec()
        return out


def position_kind(cls: type) -> str:
    """How a positional class is used: "additive" (on embeddings), "rotary" (q/k hook) or "bias".

    A class registered by a user may say so with a ``position_kind`` attribute.
    """
    declared = getattr(cls, "position_kind", None)
    if declared is not None:
        return declared
    if issubclass(cls, RotaryEmbedding):
        return "rotary"
    if issubclass(cls, ALiBi):
        return "bias"
    return "additive"


@dataclass(frozen=True)
class BlockContext:
    """What the enclosing spec fixes for a block."""

    dim_model: int
    kind: str  # "encoder" | "decoder"
    cross: bool  # an encoder-decoder's decoder block
    positions: tuple[tuple[Mapping[str, Any], str], ...]  # attention-side (spec, path): rotary, bias
    max_seq_len: int | None
    residual_context: Mapping[str, Any]


def resolve_block(spec: Any, path: str, ctx: BlockContext) -> BlockConfig:
    """Check a block spec at ``path`` (e.g. ``decoder.block``) into a :class:`BlockConfig`."""
    block = to_config(CrossBlockSpec if ctx.cross else BlockSpec, spec, path)
    attention = resolve_attention(block.attention, join_path(path, "attention"), ctx, self_attention=True)
    cross = None
    if ctx.cross:
        cross_spec = block.cross_attention
        if cross_spec is None:
            # Defaults to the self-attention's keys, with the separate projections memory needs.
            cross_spec = {**attention.to_spec(), "fused_qkv": False}
        cross = resolve_attention(cross_spec, join_path(path, "cross_attention"), ctx, self_attention=False)
    dim = {"dim_model": ctx.dim_model}
    feedforward = resolve_choice(FEEDFORWARD_REGISTRY, block.feedforward, join_path(path, "feedforward"), dim)
    norm = resolve_choice(NORM_REGISTRY, block.norm, join_path(path, "norm"), {"dim": ctx.dim_model})
    residual = resolve_residual(block.residual, join_path(path, "residual"), ctx.residual_context)
    return BlockConfig(ctx.kind, attention, feedforward, norm, residual, path, cross)


def resolve_residual(spec: Any, path: str, context: Mapping[str, Any]) -> Choice:
    # DeepNorm takes its alpha/beta from the stack depths unless they are given outright.
    explicit = isinstance(spec, Mapping) and (spec.get("alpha") is not None or spec.get("beta") is not None)
    return resolve_choice(RESIDUAL_REGISTRY, spec, path, {} if explicit else context)


def resolve_attention(spec: Any, path: str, ctx: BlockContext, self_attention: bool) -> AttentionConfig:
    attn = to_config(AttentionSpec, spec, path)
    if attn.num_kv_heads is not None and attn.num_heads % attn.num_kv_heads:
        raise ConfigError(
            f"{join_path(path, 'num_heads')}={attn.num_heads} must be a multiple of "
            f"num_kv_heads={attn.num_kv_heads}",
            join_path(path, "num_kv_heads"),
        )
    if attn.dim_head is None:
        if ctx.dim_model % attn.num_heads:
            raise ConfigError(
                f"dim_model={ctx.dim_model} (key 'dim_model') is not divisible by "
                f"num_heads={attn.num_heads}; change one of them or set dim_head",
                join_path(path, "num_heads"),
            )
        dim_head = ctx.dim_model // attn.num_heads
    else:
        dim_head = attn.dim_head
    causal = ctx.kind == "decoder" and self_attention
    mechanism_path = join_path(path, "mechanism")
    mechanism = _resolve_mechanism(attn.mechanism, mechanism_path, attn.num_heads, dim_head, causal)
    cls = mechanism.cls
    if not self_attention and attn.fused_qkv:
        raise ConfigError(
            "cross-attention needs separate q/k/v projections: set it to false", join_path(path, "fused_qkv")
        )
    if not getattr(cls, "requires_input_projection", True):
        _check_token_mixer(attn, path, ctx, dim_head, mechanism.name, self_attention)
    positions = _resolve_positions(attn, path, ctx, dim_head, mechanism) if self_attention else ()
    return AttentionConfig(attn, mechanism, causal, dim_head, path, positions)


def _resolve_mechanism(spec: Any, path: str, num_heads: int, dim_head: int, causal: bool) -> Choice:
    name = spec.get("name") if isinstance(spec, Mapping) else spec
    cls = ATTENTION_REGISTRY.get(name, join_path(path, "name")) if isinstance(name, str) else None
    sizes = {"num_heads": num_heads, "dim_head": dim_head}
    context = {need: sizes[need] for need in getattr(cls, "needs", ())}
    if causal and cls is not None:
        causal_ok = [
            n for n in ATTENTION_REGISTRY.names() if getattr(ATTENTION_REGISTRY.get(n), "causal_safe", False)
        ]
        if not getattr(cls, "causal_safe", False):
            raise ConfigError(
                f"a decoder's self-attention is causal, and {name!r} has no causal form",
                join_path(path, "name"),
                choices=causal_ok,
            )
        context["causal"] = True
    return resolve_choice(ATTENTION_REGISTRY, spec, path, context)


def _check_token_mixer(
    attn: AttentionSpec, path: str, ctx: BlockContext, dim_head: int, name: str, self_attention: bool
) -> None:
    # Token mixers (FNet, pooling) work on the layer input, so they have no q/k/v to shape or rotate.
    if attn.num_heads * dim_head != ctx.dim_model:
        raise ConfigError(
            f"{name!r} mixes the input itself: num_heads * dim_head must equal dim_model",
            join_path(path, "dim_head"),
        )
    for key, bad in (
        ("num_kv_heads", attn.num_kv_heads not in (None, attn.num_heads)),
        ("fused_qkv", attn.fused_qkv),
    ):
        if bad:
            raise ConfigError(
                f"{name!r} has no q/k/v projections, so {key} has no meaning", join_path(path, key)
            )
    if not self_attention:
        raise ConfigError(
            f"{name!r} mixes the input itself and cannot attend to memory",
            join_path(path, "mechanism", "name"),
        )
    for spec, position_path in ctx.positions:
        if position_kind(POSITIONAL_REGISTRY.get(spec["name"], position_path)) == "rotary":
            raise ConfigError(
                f"{name!r} has no queries or keys for rotary positions ({position_path})",
                join_path(path, "mechanism", "name"),
            )


def _resolve_positions(
    attn: AttentionSpec, path: str, ctx: BlockContext, dim_head: int, mechanism: Choice
) -> tuple[Choice, ...]:
    out = []
    for spec, position_path in ctx.positions:
        cls = POSITIONAL_REGISTRY.get(spec["name"], join_path(position_path, "name"))
        if position_kind(cls) == "rotary" and dim_head % 2:
            raise ConfigError(
                f"rotary positions ({position_path}) need an even head dim, but dim_model={ctx.dim_model}"
                f" with num_heads={attn.num_heads} gives dim_head={dim_head}",
                join_path(path, "dim_head" if attn.dim_head is not None else "num_heads"),
            )
        if position_kind(cls) == "bias" and getattr(mechanism.cls, "mask_support", "full") != "full":
            raise ConfigError(
                f"{mechanism.name!r} cannot take the additive bias of {spec['name']!r} ({position_path})",
                join_path(path, "mechanism", "name"),
            )
        if ctx.kind == "encoder" and "symmetric" in config_fields(options_dataclass(cls)):
            # An encoder attends both ways, so its bias falls off with distance on both sides; in a
            # causal decoder the two forms agree on every key it may see.
            spec = {"symmetric": True, **spec}
        context = {"dim_model": ctx.dim_model, "num_heads": attn.num_heads, "dim_head": dim_head}
        if ctx.max_seq_len is not None:
            context["max_seq_len"] = ctx.max_seq_len
        out.append(resolve_choice(POSITIONAL_REGISTRY, spec, position_path, context))
    return tuple(out)
