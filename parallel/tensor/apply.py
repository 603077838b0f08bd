"""``apply_tensor_parallel``: tensor (and sequence) parallelism from the model's plan, in place.

The plan (plan.py) is the components' own ``tp_plan()`` declarations, an HF family's plan from
parallel/plans/, or the caller's glob patterns, less the parts kept whole (parts.py). Each target gets
its DTensor style (styles.py). The colwise projections of an owner with a rowwise partner share one
replicated input, made once by a hook on the innermost module holding them (the owner itself, or HF
BERT's ``attention.self``), so the backward all-reduces once per owner, as in Megatron; under
sequence parallel the same hook all-gathers the sequence-sharded input. The LM head's output stays
sharded on the vocabulary for loss-parallel cross entropy. Integer attributes a module's
``tp_divide()`` names (head counts) are divided by the TP size, and its buffers indexed by them
(ALiBi slopes) keep this rank's contiguous slice, matching the head split of the projections.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

from brickwork.errors import ConfigError
from brickwork.layout import PlanValue
from brickwork.layout.vocab_padding import VocabPadding, module_padding, pad_vocabulary
from brickwork.parallel.config import ParallelConfig
from brickwork.parallel.expert_parallel import expert_module_paths
from brickwork.parallel.plans import plan_for
from brickwork.parallel.tensor.checks import (
    check_sequence_parallel,
    check_tensor_parallel,
    divided_attributes,
)
from brickwork.parallel.tensor.layers import ids_in_range_hook
from brickwork.parallel.tensor.parts import whole_modules
from brickwork.parallel.tensor.plan import (
    PlanEntry,
    component_plan,
    get_module,
    merge_plans,
    name_plan,
    output_paths,
    paddable_paths,
    tp_divide,
)
from brickwork.parallel.tensor.styles import make_style
from brickwork.parallel.tensor.vocab_padding import remap_ids_hook


@dataclass(frozen=True)
class TensorParallelPlan:
    """One model's resolved and checked plan: its ``entries``; the glob ``patterns`` and ``divide``
    in effect (an HF family's, or the caller's), which a pipeline stage filters to its own modules;
    and the paths of the modules kept ``whole`` on every rank."""

    entries: list[PlanEntry]
    patterns: Mapping[str, PlanValue]
    divide: Mapping[str, Sequence[str]]
    whole: frozenset[str]


def tensor_parallel_plan(
    model: nn.Module,
    config: ParallelConfig,
    plan: Mapping[str, PlanValue] | None = None,
    divide: Mapping[str, Sequence[str]] | None = None,
) -> TensorParallelPlan:
    """The plan ``apply_tensor_parallel`` follows, checked against ``config``'s TP size; nothing changes.

    ``plan`` (glob pattern -> style) wins over a component's entry for the same module; without it an
    unmodified HF model of a family in parallel/plans/ takes that family's plan. Parts kept whole
    (the dist dict's ``parts``, ``part`` annotations, experts under expert parallel) leave the plan.
    """
    known = plan_for(model) if plan is None else None
    if known is not None:
        known.check(config.tensor_parallel_size)
        plan, divide = known.plan, {**known.divide, **(divide or {})}
    whole = whole_modules(model, dict(config.parts))
    if config.expert_parallel_size > 1:
        whole |= expert_module_paths(model)
    merged = merge_plans(component_plan(model), name_plan(model, plan) if plan else [])
    entries = [entry for entry in merged if entry.path not in whole]  # those keep their full weights
    tp = config.tensor_parallel_size
    if tp > 1:
        if not entries:
            raise ConfigError(
                f"tensor_parallel_size={tp} but {type(model).__name__} declares no tensor-parallel plan",
                "tensor_parallel_size",
            )
        check_tensor_parallel(model, entries, tp, whole)
        if config.sequence_parallel:
            check_sequence_parallel(model, whole)
    return TensorParallelPlan(entries, dict(plan or {}), dict(divide or {}), frozenset(whole))


def apply_tensor_parallel(
    model: nn.Module,
    mesh: DeviceMesh,
    config: ParallelConfig,
    *,
    plan: Mapping[str, PlanValue] | None = None,
    divide: Mapping[str, Sequence[str]] | None = None,
    split_input: bool = True,
) -> nn.Module:
    """Shard ``model`` in place over ``mesh``'s "tp" dim (or a 1-D ``mesh``) as its plan says; returns it.

    ``plan`` and ``divide`` as :func:`tensor_parallel_plan` takes them (``divide`` maps module globs
    to extra integer attributes to divide by the TP size, e.g. ``{"transformer.h.*.attn":
    ["split_size", "num_heads"]}``, for models without ``tp_divide``). Under ``sequence_parallel``
    the model's ``layers`` get their input split on the sequence dim (unless ``split_input`` is False:
    a later pipeline stage, whose input arrives split already). A vocabulary that the TP size does
    not divide is padded to a multiple of ``tp × vocab_multiple``, and one the model padded itself is
    laid out again over the ranks. At tensor_parallel_size 1 the plan is only checked.
    """
    layout = tensor_parallel_plan(model, config, plan, divide)
    if config.tensor_parallel_size == 1:
        return model
    tp_mesh = mesh if mesh.ndim == 1 else mesh["tp"]
    entries, whole = layout.entries, layout.whole
    divided = divided_attributes(model, layout.divide, tp_mesh.size(), whole)
    tied = _tied_parameters(model)
    _pad_vocabularies(model, entries, tp_mesh.size(), config.vocab_multiple)
    parallelize_module(model, tp_mesh, _styles(model, entries, tp_mesh, config.sequence_parallel))
    if config.sequence_parallel:
        _split_sequence_at_layers(model, tp_mesh, split_input)
    _divide_attributes(model, divided, tp_mesh, whole)
    _retie(model, tied, {id(model.get_submodule(p)) for p in {e.path for e in entries} | set(whole)})
    return model


def _pad_vocabularies(model: nn.Module, entries: Sequence[PlanEntry], tp: int, vocab_multiple: int) -> None:
    """Pad every paddable module whose vocabulary ``tp`` does not divide, or that the model padded
    itself (brickwork/layout/vocab_padding.py), for ``tp`` ranks.

    A vocabulary that ``tp`` divides keeps its exact layout. A model's own padding keeps its rows where
    ``tp`` divides them, laid out per shard. Every vocabulary-parallel embedding first checks its ids
    against the real vocabulary, then (when padded) moves them to their padded rows; both hooks come
    before the style's own input hook.
    """
    groups: dict[VocabPadding, list[str]] = {}
    for path, size in paddable_paths(model, entries).items():
        module = model.get_submodule(path)
        own = module_padding(module)
        vocab = size if own is None else own.vocab
        if isinstance(module, nn.Embedding):
            module.register_forward_pre_hook(ids_in_range_hook(vocab))
        if own is not None and size % tp == 0:
            groups.setdefault(VocabPadding(vocab, size, tp), []).append(path)
        elif own is not None or size % tp:
            groups.setdefault(VocabPadding.for_size(vocab, tp, vocab_multiple), []).append(path)
    for padding, paths in groups.items():
        pad_vocabulary(model, paths, padding)
        for path in paths:
            module = model.get_submodule(path)
            if isinstance(module, nn.Embedding):
                module.register_forward_pre_hook(remap_ids_hook(padding))


def _styles(
    model: nn.Module, entries: Sequence[PlanEntry], mesh: DeviceMesh, sequence_parallel: bool
) -> dict[str, ParallelStyle]:
    """Path -> DTensor style of every entry that has one; hooks each owner of a colwise/rowwise pair so
    its colwise projections share one replicated input (see the module docstring)."""
    by_owner: dict[str, list[PlanEntry]] = {}
    for entry in entries:
        by_owner.setdefault(entry.owner, []).append(entry)
    styles = {}
    outputs = output_paths(entries)
    for group in by_owner.values():
        for entry in group:
            style = make_style(
                entry.style,
                segments=entry.segments,
                sequence_parallel=sequence_parallel,
                model_output=entry.path in outputs,
            )
            if style is not None:
                styles[entry.path] = style
        colwise = [e.path for e in group if e.style == "colwise"]
        if colwise and any(e.style == "rowwise" for e in group):
            _gather_owner_input(get_module(model, _common_parent(colwise), "plan"), mesh, sequence_parallel)
    return styles


def _divide_attributes(
    model: nn.Module, named: Sequence[tuple[nn.Module, str]], mesh: DeviceMesh, whole: Set[str]
) -> None:
    """Divide by the TP size each (module, attribute) ``divide`` named, then what every module's
    ``tp_divide()`` names; its per-head buffers (e.g. ALiBi slopes [H]) keep this rank's contiguous slice."""
    tp, rank = mesh.size(), mesh.get_local_rank()
    for module, attr in named:
        setattr(module, attr, getattr(module, attr) // tp)
    for name, module in model.named_modules():
        if name in whole:
            continue
        divided = [a for a in tp_divide(module) if isinstance(getattr(module, a, None), int)]
        sizes = {getattr(module, a) for a in divided}
        for attr in divided:
            setattr(module, attr, getattr(module, attr) // tp)
        for buffer_name, buffer in list(module.named_buffers(recurse=False)):
            if buffer is not None and buffer.dim() >= 1 and buffer.shape[0] in sizes:
                module._buffers[buffer_name] = buffer.chunk(tp, dim=0)[rank].clone()


def _common_parent(paths: Sequence[str]) -> str:
    """The innermost module holding every one of ``paths``: the one whose input feeds only them
    (an owner's own input may also feed a residual, as in HF BERT's attention)."""
    columns = zip(*(path.split(".")[:-1] for path in paths))  # the i-th parent name of each path
    return ".".join(names[0] for names in itertools.takewhile(lambda names: len(set(names)) == 1, columns))


def _gather_owner_input(owner: nn.Module, mesh: DeviceMesh, sequence_parallel: bool) -> None:
    params = list(inspect.signature(owner.forward).parameters)
    name = params[0] if params else ""  # the input, where it is passed by keyword
    source = [Shard(1)] if sequence_parallel else [Replicate()]

    def to_replicated(x: Any) -> Any:
        if x is None or isinstance(x, DTensor):
            return x
        return DTensor.from_local(x, mesh, source, run_check=False).redistribute(mesh, [Replicate()])

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            return (to_replicated(args[0]), *args[1:]), kwargs
        if name in kwargs:
            kwargs = {**kwargs, name: to_replicated(kwargs[name])}
        return args, kwargs

    owner.register_forward_pre_hook(hook, with_kwargs=True)


def _split_sequence_at_layers(model: nn.Module, mesh: DeviceMesh, split_input: bool) -> None:
    layers = model.get_submodule("layers")
    for name, param in layers.named_parameters():
        if not isinstance(param, DTensor):
            raise ConfigError(
                f"layers.{name} is not covered by any tensor-parallel plan; under sequence parallel every "
                "norm must be declared 'sequence_parallel'",
                "sequence_parallel",
            )

    def split(module: nn.Module, args: tuple) -> tuple:
        length = args[0].shape[1]
        if length % mesh.size():
            # An uneven split would leave the ranks' later collectives of different sizes: a crash
            # or a hang in the backward instead of this error, which every TP peer raises alike.
            raise ValueError(
                f"sequence_parallel splits the sequence over tensor_parallel_size={mesh.size()} ranks: "
                f"its length {length} must be a multiple of {mesh.size()} (a causal LM's input length is "
                "that of its labels)"
            )
        x = DTensor.from_local(args[0], mesh, [Replicate()], run_check=False)
        return (x.redistribute(mesh, [Shard(1)]).to_local(), *args[1:])

    if split_input:
        # The first layer held (a pipeline stage's ModuleList keeps the model's layer indices).
        next(iter(layers)).register_forward_pre_hook(split)


def _tied_parameters(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """Groups of (module, attribute) that hold the very same Parameter (tied embeddings)."""
    groups: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            groups.setdefault(id(param), []).append((module, name))
    return [group for group in groups.values() if len(group) > 1]


def _retie(model: nn.Module, tied: list[list[tuple[nn.Module, str]]], laid_out: Set[int]) -> None:
    """Make every holder of a shared weight point at one Parameter again: a style registers a new
    Parameter on the module it shards, which unties it.

    The sharded holder's Parameter wins; a holder the plan does not name (HF BERT's
    ``cls.predictions.bias``, tied to ``decoder.bias``) follows it. ``laid_out`` holds the ids of the
    modules whose layout was decided (plan targets, parts kept whole): those must agree.
    """
    for group in tied:
        values = [getattr(module, name) for module, name in group]
        source = next((v for v in values if isinstance(v, DTensor)), values[0])
        for (module, name), current in zip(group, values):
            if isinstance(current, DTensor) and isinstance(source, DTensor):
                if current.placements != source.placements:
                    raise ConfigError(
                        f"a tied weight is sharded two ways ({source.placements} vs {current.placements}); "
                        "tied modules need plans that split it the same way"
                    )
            elif isinstance(current, DTensor) != isinstance(source, DTensor) and id(module) in laid_out:
                raise ConfigError("a tied weight is sharded in one of its modules but not in the other")
            module.register_parameter(name, source)
