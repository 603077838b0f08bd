"""Stacks, blocks and attention layers, each built from its spec section and resolved back into it.

What the enclosing model fixes for a stack's blocks (the width, causality, the attention-side
positions, the depths) travels in a :class:`Scope`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import nn

from brickwork.blocks import Block
from brickwork.blocks.block import BlockSpec, CrossBlockSpec
from brickwork.blocks.model_kind import Stack, StackSection
from brickwork.blocks.reversible import ReversibleLayers
from brickwork.components.attention import ATTENTION_REGISTRY, MultiHeadAttention
from brickwork.components.attention.multi_head import check_causal, check_geometry
from brickwork.components.configurable import options_dataclass
from brickwork.components.feedforward import FEEDFORWARD_REGISTRY
from brickwork.components.residual import NORM_REGISTRY, RESIDUAL_REGISTRY
from brickwork.errors import ConfigError, join_path
from brickwork.factory.choice import build_choice, configure, diff_spec, lookup, merge_spec
from brickwork.factory.positions import Position
from brickwork.memory import check_fits
from brickwork.option_types import config_fields, config_to_dict, construct, to_config

# A stack deeper than this is checked against free memory from its first layer before the others
# are built; a shallower one is checked whole, with the model.
LAYERS_CHECKED_FIRST = 256
# The ``MultiHeadAttention`` arguments a block sets itself; the spec writes the mechanism as
# ``mechanism``, a registry choice built here and passed in as ``attention``.
SET_BY_BLOCK = ("dim_model", "causal", "attention", "attention_options", "rotary", "position_bias")


class Walked(NamedTuple):
    """What a spec section built, its resolved spec, the attention-side positions resolved in it (the
    model's spec records them once) and, for a block, its norm as a partial taking ``dim``."""

    built: Any
    spec: dict[str, Any]
    positions: list[dict[str, Any]]
    norm: functools.partial | None = None


@dataclass(frozen=True)
class Scope:
    """What the enclosing spec fixes for the blocks of one stack."""

    dim_model: int
    causal: bool  # a decoder stack's self-attention
    cross: bool  # an encoder-decoder's decoder: its blocks attend to the encoder's output
    hooks: tuple[Position, ...]  # attention-side positions: rotary, bias
    depths: Mapping[str, Any]  # the stack depths DeepNorm takes its alpha/beta from
    max_seq_len: int | None = None
    device: torch.device | None = None  # where the model goes, for the deep-stack memory check

    @property
    def sizes(self) -> dict[str, int]:
        return scope_sizes(self.dim_model, self.max_seq_len)


def scope_sizes(dim_model: int, max_seq_len: int | None) -> dict[str, int]:
    """The sizes a model fixes for the positional choices (``max_seq_len`` when it has one)."""
    return {"dim_model": dim_model} | ({"max_seq_len": max_seq_len} if max_seq_len is not None else {})


def walk_stack(stack: StackSection, name: str, scope: Scope) -> Walked:
    """The built :class:`Stack`, its resolved spec and its blocks' resolved attention-side positions."""
    with torch.device("meta"):  # the stack's block, for its resolved spec and size: allocates nothing
        base = walk_block(stack.block, join_path(name, "block"), scope)
    if stack.num_layers > LAYERS_CHECKED_FIRST and scope.device is not None:
        check_fits(base.built, scope.device, stack.num_layers, join_path(name, "num_layers"))
    blocks, diffs = [], {}
    for i in range(stack.num_layers):
        path = join_path(name, "layers", i) if i in stack.layers else join_path(name, "block")
        block = walk_block(merge_spec(stack.block, stack.layers.get(i, {})), path, scope)
        blocks.append(block.built)
        if diff := diff_spec(base.spec, block.spec):
            diffs[i] = diff
    spec = {"num_layers": stack.num_layers, "block": base.spec, "layers": diffs}
    if stack.reversible:  # written only when on, so that existing resolved specs stay as they are
        spec["reversible"] = True
        blocks = construct(ReversibleLayers, "", {"blocks": join_path(name, "reversible")}, blocks=blocks)
    return Walked(Stack(blocks, base.norm), spec, base.positions)


def walk_block(spec: Any, path: str, scope: Scope) -> Walked:
    """A :class:`Block` with its norm, its resolved spec and its resolved attention-side positions."""
    block = to_config(CrossBlockSpec if scope.cross else BlockSpec, spec, path)
    attention_path = join_path(path, "attention")
    cross = None
    if scope.cross:  # built first: the order fixes which random draws default-initialised weights take
        cross_spec = block.cross_attention
        if cross_spec is None:  # the self-attention's keys, with the separate projections memory needs
            with torch.device("meta"):
                own = walk_attention(block.attention, attention_path, scope)
            cross_spec = own.spec | {"fused_qkv": False}
        cross = walk_attention(cross_spec, join_path(path, "cross_attention"), scope, cross=True)
    attention = walk_attention(block.attention, attention_path, scope)
    resolved = {"attention": attention.spec} | ({"cross_attention": cross.spec} if cross else {})
    feedforward, resolved["feedforward"] = build_choice(
        FEEDFORWARD_REGISTRY, block.feedforward, join_path(path, "feedforward"), dim_model=scope.dim_model
    )
    norm_cls, norm = lookup(NORM_REGISTRY, block.norm, join_path(path, "norm"))
    norm_options, resolved["norm"] = configure(norm_cls, norm, join_path(path, "norm"), dim=scope.dim_model)
    norm = functools.partial(norm_cls, **norm_options)  # each sublayer's, and the stack's final norm
    # DeepNorm takes its alpha/beta from the stack depths unless they are given outright.
    given = isinstance(block.residual, Mapping) and any(
        block.residual.get(k) is not None for k in ("alpha", "beta")
    )
    residual, resolved["residual"] = build_choice(
        RESIDUAL_REGISTRY, block.residual, join_path(path, "residual"), **({} if given else scope.depths)
    )
    sources = {"cross_attention.attention": join_path(path, "cross_attention", "mechanism", "name")}
    built = construct(Block, path, sources, attention=attention.built, feedforward=feedforward, norm=norm,
                      residual=residual, cross_attention=cross and cross.built)  # fmt: skip
    return Walked(built, resolved, attention.positions, norm)


def walk_attention(spec: Mapping[str, Any], path: str, scope: Scope, cross: bool = False) -> Walked:
    """A ``MultiHeadAttention`` from its spec: its own options, checked by its ``Config``, and mechanism."""
    config_cls = options_dataclass(MultiHeadAttention)
    keys = [*(k for k in config_fields(config_cls) if k not in SET_BY_BLOCK), "mechanism"]
    for key in spec:
        if key not in keys and key != "dim_model":
            raise ConfigError(f"unknown key {key!r}", join_path(path, str(key)), choices=keys, got=key)
    layer_spec = {k: v for k, v in spec.items() if k not in ("mechanism", "qk_norm")}
    config = to_config(config_cls, layer_spec, path, dim_model=scope.dim_model)  # geometry checked too
    layer = {k: v for k, v in config_to_dict(config).items() if k not in (*SET_BY_BLOCK, "qk_norm")}
    _, dim_head = check_geometry(config.dim_model, config.num_heads, config.num_kv_heads, config.dim_head)
    qk_norm, qk_norm_spec = None, {}  # written back only when set: other layers' specs stay as they were
    if spec.get("qk_norm") is not None:
        norm_path = join_path(path, "qk_norm")
        norm_cls, norm = lookup(NORM_REGISTRY, spec["qk_norm"], norm_path)
        norm_options, qk_norm_spec["qk_norm"] = configure(norm_cls, norm, norm_path, dim=dim_head)
        qk_norm = functools.partial(norm_cls, **norm_options)
    mechanism_path = join_path(path, "mechanism")
    name_path = join_path(mechanism_path, "name")
    cls, mechanism = lookup(ATTENTION_REGISTRY, spec.get("mechanism", "scaled_dot_product"), mechanism_path)
    causal = scope.causal and not cross
    if causal:
        construct(check_causal, "", {"causal": name_path}, cls=cls)
    sizes = {"num_heads": layer["num_heads"], "dim_head": dim_head}
    fixed = {need: sizes[need] for need in cls.needs} | ({"causal": True} if causal else {})
    options, mechanism_spec = configure(cls, mechanism, mechanism_path, **fixed)

    hooks: dict[str, nn.Module] = {}
    sources = {"causal": name_path, "attention": name_path}
    hook_specs = []
    for hook_cls, hook_spec, hook_path in () if cross else scope.hooks:
        if not scope.causal and "symmetric" in config_fields(options_dataclass(hook_cls)):
            # An encoder attends both ways, so its bias falls off with distance on both sides; in a
            # causal decoder the two forms agree on every key it may see.
            hook_spec = {"symmetric": True, **hook_spec}
        try:
            hook_options, resolved_hook = configure(hook_cls, hook_spec, hook_path, **sizes, **scope.sizes)
        except ConfigError as err:
            if layer["dim_head"] is not None:
                raise
            # The head size was derived, so the key to change may be dim_model or num_heads.
            heads = f"{join_path(path, 'num_heads')}={layer['num_heads']}"
            derived = f"dim_head={dim_head} is dim_model={scope.dim_model} / {heads}"
            raise ConfigError(f"{err.reason} ({derived})", err.path, err.choices, err.got) from None
        role = "rotary" if hook_cls.position_kind == "rotary" else "position_bias"
        hooks[role], sources[role] = construct(hook_cls, hook_path, **hook_options), hook_path
        hook_specs.append(resolved_hook)
    attention = construct(cls, mechanism_path, **options)
    built = construct(MultiHeadAttention, path, sources, **layer, qk_norm=qk_norm, dim_model=scope.dim_model,
                      attention=attention, causal=causal, **hooks)  # fmt: skip
    return Walked(built, {**layer, **qk_norm_spec, "mechanism": mechanism_spec}, hook_specs)
