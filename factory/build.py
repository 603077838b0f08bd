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
from typing import Any, Literal

import torch
from torch import nn

from brickwork.blocks import MODELS
from brickwork.blocks.block import CrossBlockSpec
from brickwork.blocks.initialization import INIT_REGISTRY, init_model
from brickwork.blocks.model_kind import PositionSpec, later_defaults
from brickwork.checks import NonNegativeInt, PositiveInt
from brickwork.components.configurable import options_dataclass
from brickwork.components.positional import POSITIONAL_REGISTRY
from brickwork.errors import ConfigError
from brickwork.factory.choice import build_choice, configure
from brickwork.factory.overrides import with_overrides
from brickwork.factory.positions import positions_spec, split_positions
from brickwork.factory.presets import get_preset
from brickwork.factory.spec_io import load_spec
from brickwork.factory.stacks import Scope, Walked, scope_sizes, walk_block, walk_stack
from brickwork.memory import check_fits
from brickwork.option_types import config_fields, config_to_dict, construct, to_config

DEEPNORM_DEPTHS = ("num_encoder_layers", "num_decoder_layers")
SpecSource = Mapping[str, Any] | str | os.PathLike[str]
Overrides = Iterable[str] | Mapping[str, Any] | None


@dataclass(kw_only=True)
class StandaloneBlockSpec(CrossBlockSpec):
    """The spec ``build_block`` takes: a block plus what a model would otherwise supply."""

    type: Literal["encoder", "decoder"] = "encoder"
    dim_model: PositiveInt
    position: PositionSpec = None
    num_encoder_layers: NonNegativeInt = 0
    num_decoder_layers: NonNegativeInt = 0


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


def resolve_spec(spec: SpecSource) -> dict[str, Any]:
    """The resolved form of a model spec (one with ``model``) or a block spec, given as ``build_model``
    takes it, as ``.spec`` of what they build; checked on the meta device: nothing is allocated."""
    data, device = read_spec(spec), torch.get_default_device()
    with torch.device("meta"):
        return walk_model(data, device).spec if "model" in data else build_block(data).spec


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
                check_fits(walk_model(data, device).built, device)
        except RuntimeError as err:
            if "overflow" not in str(err):
                raise
            raise ConfigError(f"the spec's sizes give a tensor too large for any machine ({err})") from None
    walked = walk_model(data, device, initialise=True)
    walked.built.spec = walked.spec
    return walked.built


def build_block(spec: SpecSource, overrides: Overrides = None) -> nn.Module:
    """Build one :class:`~brickwork.blocks.Block` from a block spec; it carries ``.spec``.

    The spec is a block's keys plus ``type`` (encoder | decoder), ``dim_model``, attention-side
    ``position`` and the stack depths DeepNorm needs (docs/spec.md)."""
    data = read_spec(spec, overrides)
    fields = to_config(StandaloneBlockSpec, data)
    if fields.type != "decoder" and fields.cross_attention is not None:
        raise ConfigError("only decoder blocks (type: decoder) have cross-attention", "cross_attention")
    additive, hooks = split_positions(fields.position)
    if additive:
        raise ConfigError(
            f"{additive[0][1]['name']!r} is added to token embeddings, which belong to a model; a block "
            "takes only attention-side positions",
            additive[0][2],
            choices=[
                n for n in POSITIONAL_REGISTRY if POSITIONAL_REGISTRY.get(n).position_kind != "additive"
            ],
        )
    depths = {key: getattr(fields, key) for key in DEEPNORM_DEPTHS}
    scope = Scope(
        fields.dim_model,
        fields.type == "decoder",
        fields.cross_attention is not None,
        tuple(hooks),
        depths if any(depths.values()) else {},
    )
    keys = [f for f in config_fields(CrossBlockSpec) if f != "cross_attention" or scope.cross]
    walked = walk_block({k: v for k, v in data.items() if k in keys}, "", scope)
    walked.built.spec = {
        "type": fields.type,
        "dim_model": fields.dim_model,
        "position": positions_spec(None, walked.positions),
        **depths,
        **walked.spec,
    }
    return walked.built


def walk_model(data: Mapping, device: torch.device, initialise: bool = False) -> Walked:
    """The model of a model spec, ``initialise``d by its ``init`` scheme; ``device`` is where it goes,
    whose free memory a very deep stack is checked against before it is built."""
    name = data.get("model")
    if not isinstance(name, str) or name not in MODELS:
        reason = "missing required key" if "model" not in data else f"unknown model kind {name!r}"
        raise ConfigError(reason, "model", choices=MODELS, got=name)
    kind = MODELS[name]
    spec = to_config(kind.spec, data)
    max_seq_len = getattr(spec, "max_seq_len", None)
    additive, hooks = split_positions(spec.position)
    make_position, position_spec = lambda: None, None
    for cls, choice, path in additive:
        if "max_seq_len" in config_fields(options_dataclass(cls)) and max_seq_len is None:
            raise ConfigError(
                f"position {choice['name']!r} ({path}) needs the model's max_seq_len", "max_seq_len"
            )
        options, position_spec = configure(cls, choice, path, **scope_sizes(spec.dim_model, max_seq_len))
        make_position = functools.partial(construct, cls, path, **options)  # built after the stacks
    init, init_spec = build_choice(INIT_REGISTRY, spec.init, "init")
    stacks_in = {s: getattr(spec, s) for s in kind.stacks}
    # The stack depths DeepNorm derives alpha and beta from (0 for a stack the kind lacks).
    depths = dict.fromkeys(DEEPNORM_DEPTHS, 0)
    depths |= {f"num_{name}_layers": stack.num_layers for name, stack in stacks_in.items()}
    stacks, resolved, hook_specs = {}, {}, None
    for stack_name, stack in stacks_in.items():
        causal = stack_name == "decoder"
        scope = Scope(
            spec.dim_model,
            causal,
            causal and len(kind.stacks) > 1,
            tuple(hooks),
            {**depths, "part": stack_name},
            max_seq_len,
            device,
        )
        walked = walk_stack(stack, stack_name, scope)
        stacks[stack_name], resolved[stack_name] = walked.built, walked.spec
        hook_specs = walked.positions if hook_specs is None else hook_specs
    model = construct(kind.build, "", spec=spec, position=make_position(), **stacks)
    resolved = {
        **{key: value for key, value in config_to_dict(spec).items() if key not in later_defaults(spec)},
        "position": positions_spec(position_spec, hook_specs),
        "init": init_spec,
        **resolved,
    }
    if initialise:
        init_model(model, init, max(stack.num_layers for stack in stacks_in.values()))
    return Walked(model, resolved, hook_specs)
