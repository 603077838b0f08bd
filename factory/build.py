"""``build_model`` / ``build_block``: one walk from a spec (dict, .yaml/.json path, preset) to a module.

Each part of the spec is checked where it is built: a registry choice by its class's ``Config``, a
section by its dataclass (a model kind's by the kind's own, blocks/model_kind.py), each component's
cross-option rules by the component; the factory only puts the key path in front of their errors.
The walk runs first on torch's ``meta`` device, which allocates nothing, so a bad spec, or one whose
weights cannot fit in memory, fails before any weight exists. The model is then built for real and
initialised by the spec's ``init`` scheme from torch's global RNG (the same seed gives the same
weights). The resolved spec (every default filled in, every choice as ``{name, **options}``) is
attached as ``model.spec``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from brickwork.blocks import MODELS, Block
from brickwork.blocks.model_kind import Stack
from brickwork.blocks.reversible import ReversibleLayers
from brickwork.components.attention import ATTENTION_REGISTRY, MultiHeadAttention
from brickwork.components.attention.multi_head import check_causal, check_geometry
from brickwork.components.configurable import options_dataclass
from brickwork.components.feedforward import FEEDFORWARD_REGISTRY
from brickwork.components.positional import POSITIONAL_REGISTRY
from brickwork.components.residual import NORM_REGISTRY, RESIDUAL_REGISTRY, DeepNormResidual, deepnorm_init_
from brickwork.errors import ConfigError, join_path
from brickwork.factory.choice import configure, diff_spec, lookup, merge_spec
from brickwork.factory.convert import config_fields, config_to_dict, construct, to_config
from brickwork.factory.initialization import INIT_REGISTRY
from brickwork.factory.memory_estimate import check_fits
from brickwork.factory.overrides import with_overrides
from brickwork.factory.positions import position_kind, positions_spec, split_positions
from brickwork.factory.presets import get_preset
from brickwork.factory.schema import BlockSpec, CrossBlockSpec, StackSpec, StandaloneBlockSpec
from brickwork.factory.spec_io import load_spec

SpecSource = Mapping[str, Any] | str | os.PathLike[str]
Overrides = Iterable[str] | Mapping[str, Any] | None
# A stack deeper than this is checked against free memory from its first layer before the others
# are built; a shallower one is checked whole, with the model.
LAYERS_CHECKED_FIRST = 256
# The ``MultiHeadAttention`` arguments a block sets itself; the spec writes the mechanism as
# ``mechanism``, a registry choice built here and passed in as ``attention``.
SET_BY_BLOCK = ("dim_model", "causal", "attention", "attention_options", "rotary", "position_bias")


@dataclass(frozen=True)
class Scope:
    """What the enclosing spec fixes for the blocks of one stack."""

    dim_model: int
    causal: bool  # a decoder stack's self-attention
    cross: bool  # an encoder-decoder's decoder: its blocks attend to the encoder's output
    hooks: tuple[tuple[dict[str, Any], str], ...]  # attention-side positions (spec, path): rotary, bias
    max_seq_len: int | None
    depths: Mapping[str, Any]  # the stack depths DeepNorm takes its alpha/beta from
    device: torch.device | None  # where the real build goes, for the memory check; None: no check

    @property
    def sizes(self) -> dict[str, int]:
        return scope_sizes(self.dim_model, self.max_seq_len)


def scope_sizes(dim_model: int, max_seq_len: int | None) -> dict[str, int]:
    """The sizes a model fixes for the positional choices (``max_seq_len`` when it has one)."""
    return {"dim_model": dim_model} | ({"max_seq_len": max_seq_len} if max_seq_len is not None else {})


def read_spec(spec: SpecSource, overrides: Overrides = None) -> dict[str, Any]:
    """A private copy of ``spec`` (loaded when it is a path, looked up when it is a preset name) with
    ``overrides`` applied."""
    if isinstance(spec, str) and not Path(spec).suffix and not Path(spec).exists():
        spec = get_preset(spec)  # a name without a file suffix: ConfigError lists the presets
    elif isinstance(spec, (str, os.PathLike)):
        spec = load_spec(spec)
    elif not isinstance(spec, Mapping):
        raise ConfigError(f"a spec must be a mapping or a .yaml/.json path, got {type(spec).__name__}")
    return with_overrides(spec, overrides or ())


def apply_overrides(spec: Mapping[str, Any], overrides: Overrides, validate: bool = True) -> dict[str, Any]:
    """A copy of ``spec`` with dotted ``overrides`` applied; ``spec`` itself is left as it was.

    ``overrides`` is a list of ``"dotted.key=value"`` strings or a mapping ``{"dotted.key": value}``.
    With ``validate`` the result is checked as ``build_model`` would (a spec with a ``model`` key) or
    ``build_block`` (without), on the meta device, so a bad override raises ConfigError naming its path.
    """
    out = with_overrides(spec, overrides)
    if validate:
        resolve_spec(out)
    return out


def resolve_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved form of a model spec (one with ``model``) or a block spec, as ``.spec`` of what
    they build, checked on the meta device: nothing is allocated."""
    with torch.device("meta"):
        return walk_model(spec, None)[1] if "model" in spec else build_block(spec).spec


def build_model(spec: SpecSource, overrides: Overrides = None) -> nn.Module:
    """Build the model a spec describes; ``overrides`` are dotted ``key=value`` strings (see apply_overrides).

    ``spec`` is a dict, a .yaml/.json path, or a preset name (``build_model("gpt-tiny")``).

    Returns a ``DecoderLM``, ``Encoder``, ``EncoderDecoder`` or ``ImageEncoder`` carrying ``.spec``.
    """
    data = read_spec(spec, overrides)
    device = torch.get_default_device()
    if device.type != "meta":  # a build on meta allocates nothing, so any size passes
        try:
            with torch.device("meta"):
                check_fits(walk_model(data, device)[0], device)
        except RuntimeError as err:
            if "overflow" not in str(err):
                raise
            raise ConfigError(f"the spec's sizes give a tensor too large for any machine ({err})") from None
    model, resolved, (scheme, depth) = walk_model(data, None)
    scheme.apply(model, depth)
    for module in model.modules():  # DeepNet's down-scaling of the branches in deepnorm blocks
        residual = getattr(module, "residual", None)
        if isinstance(residual, DeepNormResidual) and residual.beta != 1.0:
            deepnorm_init_(module, residual.beta)
    model.spec = resolved
    return model


def build_block(spec: SpecSource, overrides: Overrides = None) -> nn.Module:
    """Build one :class:`~brickwork.blocks.Block` from a block spec; it carries ``.spec``.

    The spec is a block's keys plus ``type`` (encoder | decoder), ``dim_model``, attention-side
    ``position`` and the stack depths DeepNorm needs (docs/spec.md)."""
    data = read_spec(spec, overrides)
    fields = to_config(StandaloneBlockSpec, data)
    if fields.type == "encoder" and fields.cross_attention is not None:
        raise ConfigError("only decoder blocks (type: decoder) have cross-attention", "cross_attention")
    additive, hooks = split_positions(fields.position)
    if additive:
        raise ConfigError(
            f"{additive[0][0]['name']!r} is added to token embeddings, which belong to a model; a block "
            "takes only attention-side positions",
            additive[0][1],
            choices=[
                n for n in POSITIONAL_REGISTRY if position_kind(POSITIONAL_REGISTRY.get(n)) != "additive"
            ],
        )
    depths = {
        "num_encoder_layers": fields.num_encoder_layers,
        "num_decoder_layers": fields.num_decoder_layers,
    }
    scope = Scope(
        fields.dim_model,
        fields.type == "decoder",
        fields.cross_attention is not None,
        tuple(hooks),
        None,
        depths if any(depths.values()) else {},
        None,
    )
    keys = [f for f in config_fields(CrossBlockSpec) if f != "cross_attention" or scope.cross]
    block, _, resolved, hook_specs = walk_block({k: v for k, v in data.items() if k in keys}, "", scope)
    block.spec = {
        "type": fields.type,
        "dim_model": fields.dim_model,
        "position": positions_spec(None, hook_specs),
        **depths,
        **resolved,
    }
    return block


def walk_model(data: Any, device: torch.device | None) -> tuple[nn.Module, dict[str, Any], tuple[Any, int]]:
    """(model, resolved spec, (init scheme, depth of the deepest stack)) of a model spec."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"a model spec must be a mapping, got {type(data).__name__}")
    name = data.get("model")
    if not isinstance(name, str) or name not in MODELS:
        reason = "missing required key" if "model" not in data else f"unknown model kind {name!r}"
        raise ConfigError(reason, "model", choices=MODELS, got=name)
    kind = MODELS[name]
    spec = to_config(kind.spec, data)
    max_seq_len = getattr(spec, "max_seq_len", None)
    additive, hooks = split_positions(spec.position)
    position, position_spec = None, None
    for choice, path in additive:
        cls, choice = lookup(POSITIONAL_REGISTRY, choice, path)
        if "max_seq_len" in config_fields(options_dataclass(cls)) and max_seq_len is None:
            raise ConfigError(
                f"position {choice['name']!r} ({path}) needs the model's max_seq_len", "max_seq_len"
            )
        options, position_spec = configure(cls, choice, path, **scope_sizes(spec.dim_model, max_seq_len))
        position = construct(cls, path, **options)
    init_cls, init = lookup(INIT_REGISTRY, spec.init, "init")
    init_options, init_spec = configure(init_cls, init, "init")
    stacks_in = {s: to_config(StackSpec, getattr(spec, s), s) for s in kind.stacks}
    depths = {
        f"num_{s}_layers": stacks_in[s].num_layers if s in stacks_in else 0 for s in ("encoder", "decoder")
    }
    stacks, resolved, hook_specs = {}, {}, None
    for stack_name, stack in stacks_in.items():
        causal = stack_name == "decoder"
        scope = Scope(
            spec.dim_model,
            causal,
            causal and len(kind.stacks) > 1,
            tuple(hooks),
            max_seq_len,
            {**depths, "part": stack_name},
            device,
        )
        stacks[stack_name], resolved[stack_name], found = walk_stack(stack, stack_name, scope)
        hook_specs = found if hook_specs is None else hook_specs
    model = construct(kind.build, "", spec=spec, position=position, stacks=stacks)
    resolved = {
        **config_to_dict(spec),
        "position": positions_spec(position_spec, hook_specs),
        "init": init_spec,
        **resolved,
    }
    depth = max(stack.num_layers for stack in stacks_in.values())
    return model, resolved, (construct(init_cls, "init", **init_options), depth)


def walk_stack(
    stack: StackSpec, name: str, scope: Scope
) -> tuple[Stack, dict[str, Any], list[dict[str, Any]]]:
    """The built stack, its resolved spec and its blocks' resolved attention-side positions."""
    overrides = layer_overrides(stack.layers, stack.num_layers, join_path(name, "layers"))
    base, norm, base_spec, hook_specs = walk_block(stack.block, join_path(name, "block"), scope)
    if stack.num_layers > LAYERS_CHECKED_FIRST and scope.device is not None:
        check_fits(base, scope.device, stack.num_layers, join_path(name, "num_layers"))
    blocks, diffs = [], {}
    for i in range(stack.num_layers):
        if i not in overrides:
            blocks.append(base if i == 0 else walk_block(stack.block, join_path(name, "block"), scope)[0])
            continue
        path = join_path(name, "layers", i)
        if not isinstance(overrides[i], Mapping):
            raise ConfigError(f"expected a mapping of block keys, got {overrides[i]!r}", path)
        block, _, block_spec, _ = walk_block(merge_spec(stack.block, overrides[i]), path, scope)
        blocks.append(block)
        if diff := diff_spec(base_spec, block_spec):
            diffs[i] = diff
    spec = {"num_layers": stack.num_layers, "block": base_spec, "layers": diffs}
    if not stack.reversible:
        return Stack(blocks, norm), spec, hook_specs
    for i, block in enumerate(blocks):
        where = join_path(name, "layers", i) if i in overrides else join_path(name, "block")
        if block.cross_attention is not None or type(block.residual) is not RESIDUAL_REGISTRY.get("pre"):
            raise ConfigError(
                f"a reversible stack couples pre-norm self-attention sublayers; {where} is not "
                "one (cross-attention, or a residual other than 'pre')",
                join_path(name, "reversible"),
            )
    spec["reversible"] = True  # written only when on, so that existing resolved specs stay as they are
    return Stack(ReversibleLayers(blocks), norm), spec, hook_specs


def layer_overrides(layers: Mapping[Any, Any], num_layers: int, path: str) -> dict[int, Any]:
    """``layers`` with keys as ints in [0, num_layers); digit strings (JSON keys) are accepted."""
    out: dict[int, Any] = {}
    for key, value in layers.items():
        index = int(key) if isinstance(key, str) and key.strip().isdigit() else key
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < num_layers:
            raise ConfigError(
                f"layer index must be an integer in [0, {num_layers}) "
                f"({join_path(path.rsplit('.', 1)[0], 'num_layers')}={num_layers}), got {key!r}",
                join_path(path, str(key)),
            )
        if index in out:
            raise ConfigError(f"layer {index} is overridden twice", join_path(path, str(key)))
        out[index] = value
    return out


def walk_block(spec: Any, path: str, scope: Scope) -> tuple[Block, functools.partial, dict, list]:
    """(block, its norm as a partial taking ``dim``, resolved spec, resolved attention-side positions)."""
    block = to_config(CrossBlockSpec if scope.cross else BlockSpec, spec, path)
    attention, attention_spec, hook_specs = walk_attention(
        block.attention, join_path(path, "attention"), scope
    )
    resolved: dict[str, Any] = {"attention": attention_spec}
    cross = None
    if scope.cross:
        # Defaults to the self-attention's keys, with the separate projections memory needs.
        cross_spec = block.cross_attention or {**attention_spec, "fused_qkv": False}
        cross, resolved["cross_attention"], _ = walk_attention(
            cross_spec, join_path(path, "cross_attention"), scope, cross=True
        )
    dim = scope.dim_model
    feedforward_cls, feedforward = lookup(
        FEEDFORWARD_REGISTRY, block.feedforward, join_path(path, "feedforward")
    )
    options, resolved["feedforward"] = configure(
        feedforward_cls, feedforward, join_path(path, "feedforward"), dim_model=dim
    )
    feedforward_layer = construct(feedforward_cls, join_path(path, "feedforward"), **options)
    norm_cls, norm = lookup(NORM_REGISTRY, block.norm, join_path(path, "norm"))
    norm_options, resolved["norm"] = configure(norm_cls, norm, join_path(path, "norm"), dim=dim)
    residual_path = join_path(path, "residual")
    residual_cls, residual = lookup(RESIDUAL_REGISTRY, block.residual, residual_path)
    # DeepNorm takes its alpha/beta from the stack depths unless they are given outright.
    explicit = residual.get("alpha") is not None or residual.get("beta") is not None
    options, resolved["residual"] = configure(
        residual_cls, residual, residual_path, **({} if explicit else scope.depths)
    )
    norm_partial = functools.partial(norm_cls, **norm_options)
    built = construct(
        Block,
        path,
        attention=attention,
        feedforward=feedforward_layer,
        norm=norm_partial,
        residual=construct(residual_cls, residual_path, **options),
        cross_attention=cross,
    )
    return built, norm_partial, resolved, hook_specs


def walk_attention(
    spec: Any, path: str, scope: Scope, cross: bool = False
) -> tuple[MultiHeadAttention, dict[str, Any], list[dict[str, Any]]]:
    """A ``MultiHeadAttention`` from its spec: the layer's own options, checked by its ``Config``, and
    its ``mechanism`` choice. Returns the layer, its resolved spec and its resolved positions."""
    if not isinstance(spec, Mapping):
        raise ConfigError(f"expected a mapping of attention keys, got {spec!r}", path)
    layer_spec = {k: v for k, v in spec.items() if k != "mechanism"}
    fixed = dict.fromkeys(SET_BY_BLOCK) | {"dim_model": scope.dim_model}
    layer_config = to_config(options_dataclass(MultiHeadAttention), layer_spec, path, **fixed)
    layer = {k: v for k, v in config_to_dict(layer_config).items() if k not in SET_BY_BLOCK}
    _, dim_head = construct(
        check_geometry,
        path,
        dim_model=scope.dim_model,
        num_heads=layer["num_heads"],
        num_kv_heads=layer["num_kv_heads"],
        dim_head=layer["dim_head"],
    )

    mechanism_path = join_path(path, "mechanism")
    name_path = join_path(mechanism_path, "name")
    cls, mechanism = lookup(ATTENTION_REGISTRY, spec.get("mechanism", "scaled_dot_product"), mechanism_path)
    causal = scope.causal and not cross
    if causal:
        construct(check_causal, "", {"causal": name_path}, cls=cls)
    if cross and not cls.requires_input_projection:
        raise ConfigError(
            f"{mechanism['name']!r} mixes the input itself and cannot attend to memory", name_path
        )
    if cross and layer["fused_qkv"]:
        raise ConfigError(
            "cross-attention needs separate q/k/v projections: set it to false", join_path(path, "fused_qkv")
        )
    sizes = {"num_heads": layer["num_heads"], "dim_head": dim_head}
    fixed = {need: sizes[need] for need in cls.needs} | ({"causal": True} if causal else {})
    options, mechanism_spec = configure(cls, mechanism, mechanism_path, **fixed)

    hooks: dict[str, nn.Module] = {}
    sources = {"causal": name_path, "attention": name_path}
    hook_specs = []
    for hook_spec, hook_path in () if cross else scope.hooks:
        hook_cls, hook_spec = lookup(POSITIONAL_REGISTRY, hook_spec, hook_path)
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
            derived = f"dim_head={dim_head} is dim_model={scope.dim_model} / num_heads={layer['num_heads']}"
            raise ConfigError(f"{err.reason} ({derived})", err.path, err.choices, err.got) from None
        role = "rotary" if position_kind(hook_cls) == "rotary" else "position_bias"
        hooks[role], sources[role] = construct(hook_cls, hook_path, **hook_options), hook_path
        hook_specs.append(resolved_hook)
    built = construct(
        MultiHeadAttention,
        path,
        sources,
        **layer,
        dim_model=scope.dim_model,
        attention=construct(cls, mechanism_path, **options),
        causal=causal,
        **hooks,
    )
    return built, {**layer, "mechanism": mechanism_spec}, hook_specs
