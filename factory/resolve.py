"""Checking a whole model spec (or a standalone block spec) and writing back its resolved form.

``resolve_model_spec(spec)`` never changes ``spec``. It raises :class:`ConfigError` naming the dotted
key path for every problem, and returns a :class:`ModelConfig` whose ``spec`` is the fully resolved
spec: every default filled in, every choice in ``{name, **options}`` form, per-layer overrides
reduced to what really differs from the stack's block.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from brickwork.components.positional import POSITIONAL_REGISTRY
from brickwork.errors import ConfigError, join_path
from brickwork.factory.choice import (
    Choice,
    diff_spec,
    merge_spec,
    normalize_choice,
    options_dataclass,
    resolve_choice,
)
from brickwork.factory.convert import config_fields, config_to_dict, to_config
from brickwork.factory.initialization import INIT_REGISTRY
from brickwork.factory.memory_estimate import check_stack_fits
from brickwork.factory.resolve_block import BlockConfig, BlockContext, position_kind, resolve_block
from brickwork.factory.schema import (
    MODEL_KINDS,
    STACKS,
    ImageEncoderSpec,
    ModelSpec,
    StackSpec,
    StandaloneBlockSpec,
)

NO_POSITION = "none"
# Stacks deeper than this are checked against free memory from one layer before each layer is
# resolved; shallower ones are checked whole, after the build's meta-device pass.
LAYERS_CHECKED_FIRST = 256
KEY_ORDER = (
    "model", "vocab_size", "dim_model", "max_seq_len", "image_size", "patch_size", "channels",
    "num_classes", "class_token", "pool", "position", "dropout", "tie_embeddings", "type_vocab_size",
    "embedding_norm", "final_norm", "head", "head_activation", "pooler", "init", "encoder", "decoder",
)  # fmt: skip


@dataclass(frozen=True)
class StackConfig:
    """A checked stack: its base ``block`` and the config of every layer (overrides applied)."""

    block: BlockConfig
    layers: list[BlockConfig]
    reversible: bool = False


@dataclass
class ModelConfig:
    """A checked model spec: typed fields, the built-on-embeddings position, init and each stack."""

    kind: str
    fields: ModelSpec
    max_seq_len: int | None
    position: Choice | None
    init: Choice
    stacks: dict[str, StackConfig] = field(default_factory=dict)
    spec: dict[str, Any] = field(default_factory=dict)


@dataclass
class StandaloneBlockConfig:
    block: BlockConfig
    dim_model: int
    spec: dict[str, Any]


def split_positions(value: Any, path: str = "position") -> tuple[list[tuple[dict[str, Any], str]], ...]:
    """(additive, attention-side) position specs, each with its key path.

    ``position`` is null, ``none``, one choice, or a list with at most one of each kind (an additive
    table, a rotary hook, a bias), e.g. ``[{name: learned}, {name: rotary}]``.
    """
    if (
        value is None
        or value == NO_POSITION
        or (isinstance(value, Mapping) and value.get("name") == NO_POSITION)
    ):
        if isinstance(value, Mapping) and len(value) > 1:
            raise ConfigError("position 'none' takes no options", path)
        return [], []
    items = list(enumerate(value)) if isinstance(value, list) else [(None, value)]
    additive, hooks, seen = [], [], {}
    for index, item in items:
        item_path = join_path(path, index)
        spec = normalize_choice(item, item_path)
        if "name" not in spec:
            raise ConfigError(
                "missing required key 'name'",
                join_path(item_path, "name"),
                choices=[*POSITIONAL_REGISTRY.names(), NO_POSITION],
            )
        if not isinstance(spec["name"], str) or spec["name"] not in POSITIONAL_REGISTRY:
            raise ConfigError(
                f"unknown positional {spec['name']!r}",
                join_path(item_path, "name"),
                choices=[*POSITIONAL_REGISTRY.names(), NO_POSITION],
                got=spec["name"],
            )
        kind = position_kind(POSITIONAL_REGISTRY.get(spec["name"]))
        if kind in seen:
            raise ConfigError(f"two {kind} positions ({seen[kind]} and {item_path}); keep one", item_path)
        seen[kind] = item_path
        (additive if kind == "additive" else hooks).append((spec, item_path))
    return additive, hooks


def positions_spec(additive: Choice | None, hooks: tuple[Choice, ...]) -> Any:
    chosen = ([additive.to_spec()] if additive is not None else []) + [h.to_spec() for h in hooks]
    if not chosen:
        return {"name": NO_POSITION}
    return chosen[0] if len(chosen) == 1 else chosen


def resolve_model_spec(spec: Any) -> ModelConfig:
    """Check a model spec dict; see the module docstring."""
    if not isinstance(spec, Mapping):
        raise ConfigError(f"a model spec must be a mapping, got {type(spec).__name__}")
    kind = spec.get("model")
    if not isinstance(kind, str) or kind not in MODEL_KINDS:
        reason = "missing required key" if "model" not in spec else f"unknown model kind {kind!r}"
        raise ConfigError(reason, "model", choices=MODEL_KINDS, got=kind)
    fields = to_config(MODEL_KINDS[kind], spec)
    max_seq_len = getattr(fields, "max_seq_len", None)
    if isinstance(fields, ImageEncoderSpec):
        max_seq_len = (fields.image_size // fields.patch_size) ** 2 + int(fields.class_token)
    additive_specs, hook_specs = split_positions(fields.position)
    position = None
    for pos_spec, pos_path in additive_specs:
        cls = POSITIONAL_REGISTRY.get(pos_spec["name"])
        if "max_seq_len" in config_fields(options_dataclass(cls)) and max_seq_len is None:
            raise ConfigError(
                f"position {pos_spec['name']!r} ({pos_path}) needs the model's max_seq_len", "max_seq_len"
            )
        context = {"dim_model": fields.dim_model, "max_seq_len": max_seq_len}
        position = resolve_choice(POSITIONAL_REGISTRY, pos_spec, pos_path, context)
    init = resolve_choice(INIT_REGISTRY, fields.init, "init")

    names = STACKS[kind]
    stacks_in = {name: to_config(StackSpec, getattr(fields, name), name) for name in names}
    depth = {name: stacks_in[name].num_layers if name in stacks_in else 0 for name in ("encoder", "decoder")}
    stacks, stack_specs = {}, {}
    for name, stack in stacks_in.items():
        ctx = BlockContext(
            dim_model=fields.dim_model,
            kind="decoder" if name == "decoder" else "encoder",
            cross=kind == "encoder_decoder" and name == "decoder",
            positions=tuple(hook_specs),
            max_seq_len=max_seq_len,
            residual_context={
                "num_encoder_layers": depth["encoder"],
                "num_decoder_layers": depth["decoder"],
                "part": name,
            },
        )
        stacks[name], stack_specs[name] = resolve_stack(stack, name, ctx)

    hooks = stacks[names[0]].block.attention.positions
    resolved = config_to_dict(fields)
    resolved["position"] = positions_spec(position, hooks)
    resolved["init"] = init.to_spec()
    resolved.update(stack_specs)
    # KEY_ORDER fixes the layout of dumped specs; a key it does not list still goes last, never lost.
    rank = {key: i for i, key in enumerate(KEY_ORDER)}
    ordered = dict(sorted(resolved.items(), key=lambda item: rank.get(item[0], len(rank))))
    return ModelConfig(kind, fields, max_seq_len, position, init, stacks, ordered)


def layer_overrides(layers: Mapping[Any, Any], num_layers: int, path: str) -> dict[int, Any]:
    """``layers`` with keys as ints in [0, num_layers); digit strings (JSON keys) are accepted."""
    num_layers_path = join_path(path.rsplit(".", 1)[0], "num_layers")
    out: dict[int, Any] = {}
    for key, value in layers.items():
        key_path = join_path(path, str(key))
        index = key
        if isinstance(key, str) and key.strip().isdigit():
            index = int(key)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < num_layers:
            raise ConfigError(
                f"layer index must be an integer in [0, {num_layers}) ({num_layers_path}={num_layers}), "
                f"got {key!r}",
                key_path,
            )
        if index in out:
            raise ConfigError(f"layer {index} is overridden twice", key_path)
        out[index] = value
    return out


def resolve_stack(stack: StackSpec, name: str, ctx: BlockContext) -> tuple[StackConfig, dict[str, Any]]:
    """The stack's block configs, and its resolved spec."""
    base = resolve_block(stack.block, join_path(name, "block"), ctx)
    if stack.num_layers > LAYERS_CHECKED_FIRST:
        check_stack_fits(base, ctx.dim_model, stack.num_layers, join_path(name, "num_layers"))
    base_spec = base.to_spec()
    overrides = layer_overrides(stack.layers, stack.num_layers, join_path(name, "layers"))
    blocks, diffs = [], {}
    for i in range(stack.num_layers):
        if i not in overrides:
            blocks.append(base)
            continue
        layer_path = join_path(name, "layers", i)
        if not isinstance(overrides[i], Mapping):
            raise ConfigError(f"expected a mapping of block keys, got {overrides[i]!r}", layer_path)
        block = resolve_block(merge_spec(stack.block, overrides[i]), layer_path, ctx)
        blocks.append(block)
        diff = diff_spec(base_spec, block.to_spec())
        if diff:
            diffs[i] = diff
    if stack.reversible:
        for i, block in enumerate(blocks):
            where = join_path(name, "layers", i) if i in overrides else join_path(name, "block")
            if block.cross_attention is not None:
                raise ConfigError("a reversible stack takes self-attention blocks only; this one has "
                                  f"cross-attention ({where})", join_path(name, "reversible"))  # fmt: skip
            if block.residual.name != "pre":
                raise ConfigError(f"a reversible stack couples pre-norm sublayers; {where}.residual is "
                                  f"{block.residual.name!r}", join_path(name, "reversible"))  # fmt: skip
    spec = {"num_layers": stack.num_layers, "block": base_spec, "layers": diffs}
    if stack.reversible:
        spec["reversible"] = True  # written only when on, so that existing resolved specs stay as they are
    return StackConfig(base, blocks, stack.reversible), spec


BLOCK_KEYS = ("attention", "cross_attention", "feedforward", "norm", "residual")


def resolve_block_spec(spec: Any) -> StandaloneBlockConfig:
    """Check a ``build_block`` spec: a block plus ``type``, ``dim_model``, ``position`` and layer counts."""
    fields = to_config(StandaloneBlockSpec, spec)
    if fields.type == "encoder" and fields.cross_attention is not None:
        raise ConfigError("only decoder blocks (type: decoder) have cross-attention", "cross_attention")
    additive, hooks = split_positions(fields.position)
    if additive:
        raise ConfigError(
            f"{additive[0][0]['name']!r} is added to token embeddings, which belong to a model; a block "
            "takes only attention-side positions",
            additive[0][1],
            choices=[
                n
                for n in POSITIONAL_REGISTRY.names()
                if position_kind(POSITIONAL_REGISTRY.get(n)) != "additive"
            ],
        )
    depths = {
        "num_encoder_layers": fields.num_encoder_layers,
        "num_decoder_layers": fields.num_decoder_layers,
    }
    ctx = BlockContext(
        dim_model=fields.dim_model,
        kind=fields.type,
        cross=fields.cross_attention is not None,
        positions=tuple(hooks),
        max_seq_len=None,
        residual_context=depths if any(depths.values()) else {},
    )
    block_keys = [k for k in BLOCK_KEYS if k != "cross_attention" or fields.cross_attention is not None]
    block = resolve_block({k: v for k, v in spec.items() if k in block_keys}, "", ctx)
    resolved = {
        "type": fields.type,
        "dim_model": fields.dim_model,
        "position": positions_spec(None, block.attention.positions),
        **depths,
        **block.to_spec(),
    }
    return StandaloneBlockConfig(block, fields.dim_model, resolved)
