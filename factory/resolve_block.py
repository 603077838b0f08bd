"""Checking one block spec (attention, feedforward, norm, residual) into typed configs.

Each rule is the component's own (``MultiHeadAttention``'s head geometry and mechanism fit, each
choice's ``Config``); this module calls them before anything is built and puts the key path in front
of their errors. Only what a spec alone decides is checked here: which stack is causal, and that
cross-attention has separate projections and a mechanism that reads memory.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from brickwork.components.attention import ATTENTION_REGISTRY
from brickwork.components.attention.multi_head import check_causal, check_geometry, check_mechanism_fits
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


# Where the layer's option names sit in an attention spec: the mechanism's options under
# ``mechanism``, and the layer's hooks come from the model's positions, chosen against the mechanism.
LAYER_TO_SPEC = {"causal": "mechanism.name", "rotary": "mechanism.name", "position_bias": "mechanism.name"}


# The attention keys a multi-head rule may name in its message ("num_heads=8 must be ...").
_ATTENTION_KEYS = re.compile(r"(?<![\w.])(num_heads|num_kv_heads|dim_head|fused_qkv)=")


def _spec_paths(reason: str, path: str, own: str | None) -> str:
    """The layer's message with each other attention key it names written as its spec path (the key
    the error is filed under already leads the message), so a rule spanning several keys names every
    one of them where the user set it."""
    return _ATTENTION_KEYS.sub(
        lambda m: m.group(0) if m.group(1) == own else f"{join_path(path, m.group(1))}=", reason
    )


def resolve_attention(spec: Any, path: str, ctx: BlockContext, self_attention: bool) -> AttentionConfig:
    attn = to_config(AttentionSpec, spec, path)
    mechanism_path = join_path(path, "mechanism")
    name = attn.mechanism.get("name") if isinstance(attn.mechanism, Mapping) else attn.mechanism
    cls = ATTENTION_REGISTRY.get(name, join_path(mechanism_path, "name")) if isinstance(name, str) else None
    causal = ctx.kind == "decoder" and self_attention
    kinds = (
        [position_kind(POSITIONAL_REGISTRY.get(s["name"], p)) for s, p in ctx.positions]
        if self_attention
        else []
    )
    try:
        _, dim_head = check_geometry(ctx.dim_model, attn.num_heads, attn.num_kv_heads, attn.dim_head)
        if cls is not None:
            if causal:
                check_causal(cls)
            check_mechanism_fits(cls, ctx.dim_model, attn.num_heads, attn.num_kv_heads or attn.num_heads,
                                 dim_head, attn.fused_qkv, "rotary" in kinds, "bias" in kinds)  # fmt: skip
    except ConfigError as err:
        raise ConfigError(
            _spec_paths(err.reason, path, err.path),
            join_path(path, LAYER_TO_SPEC.get(err.path, err.path)),
            err.choices,
        ) from None
    if not self_attention and cls is not None and not cls.requires_input_projection:
        raise ConfigError(f"{name!r} mixes the input itself and cannot attend to memory",
                          join_path(mechanism_path, "name"))  # fmt: skip
    if not self_attention and attn.fused_qkv:
        raise ConfigError(
            "cross-attention needs separate q/k/v projections: set it to false", join_path(path, "fused_qkv")
        )
    sizes = {"num_heads": attn.num_heads, "dim_head": dim_head}
    context = {need: sizes[need] for need in getattr(cls, "needs", ())}
    if causal:
        context["causal"] = True
    mechanism = resolve_choice(ATTENTION_REGISTRY, attn.mechanism, mechanism_path, context)
    positions = _resolve_positions(attn, path, ctx, dim_head) if self_attention else ()
    return AttentionConfig(attn, mechanism, causal, dim_head, path, positions)


def _resolve_positions(
    attn: AttentionSpec, path: str, ctx: BlockContext, dim_head: int
) -> tuple[Choice, ...]:
    out = []
    for spec, position_path in ctx.positions:
        cls = POSITIONAL_REGISTRY.get(spec["name"], join_path(position_path, "name"))
        if ctx.kind == "encoder" and "symmetric" in config_fields(options_dataclass(cls)):
            # An encoder attends both ways, so its bias falls off with distance on both sides; in a
            # causal decoder the two forms agree on every key it may see.
            spec = {"symmetric": True, **spec}
        context = {"dim_model": ctx.dim_model, "num_heads": attn.num_heads, "dim_head": dim_head}
        if ctx.max_seq_len is not None:
            context["max_seq_len"] = ctx.max_seq_len
        try:
            out.append(resolve_choice(POSITIONAL_REGISTRY, spec, position_path, context))
        except ConfigError as err:
            if attn.dim_head is not None:
                raise
            # The head size was derived, so the key to change may be dim_model or num_heads.
            raise ConfigError(
                f"{err.reason} (dim_head={dim_head} is dim_model={ctx.dim_model} / "
                f"num_heads={attn.num_heads})",
                err.path,
                err.choices,
                err.got,
            ) from None
    return tuple(out)
