"""Tensor (and sequence) parallelism applied from plans: the components' own, or glob patterns by name.

A plan is a list of :class:`PlanEntry`: which module gets which style, and which module declared it
(its *owner*, e.g. an attention layer for its q/k/v/out projections). From that list alone:

- each target gets its DTensor style (parallel/styles.py);
- an owner with colwise and rowwise children has the input of the innermost module holding its
  colwise ones (the owner itself, or HF BERT's ``attention.self`` under ``attention``) turned into one
  replicated DTensor, so the q/k/v (or up/gate) projections share it and the backward all-reduces
  once per owner, as in Megatron; under sequence parallel the same hook all-gathers the
  sequence-sharded input instead;
- an owner whose colwise children have no rowwise partner produces the model's output (the LM head):
  that output stays sharded on the vocabulary for loss-parallel cross entropy;
- integer attributes named by a module's ``tp_divide()`` (head counts) are divided by the TP size, and
  that module's buffers indexed by them on dim 0 (per-head tables such as ALiBi slopes) keep this
  rank's contiguous slice, matching the head split of the projections.
"""

from __future__ import annotations

import fnmatch
import inspect
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import parallelize_module

from brickwork.errors import ConfigError, join_path
from brickwork.parallel.styles import is_transposed_linear, make_style, parse_style
from brickwork.parallel.tensor_parallel_layers import ids_in_range_hook
from brickwork.parallel.vocab_padding import VocabPadding, pad_vocabulary, remap_ids_hook, unpad_logits_hook


@dataclass(frozen=True)
class PlanEntry:
    """``path`` (a module's dotted name) gets ``style``; ``owner`` is the module that declared it."""

    owner: str
    path: str
    style: str
    segments: int = 1


def component_plan(model: nn.Module) -> list[PlanEntry]:
    """Every entry of every ``tp_plan()`` declared by ``model``'s modules, as full dotted paths."""
    entries = []
    for owner_name, owner in model.named_modules():
        declare = getattr(owner, "tp_plan", None)
        if not callable(declare):
            continue
        for child, value in declare().items():
            path = join_path(owner_name, child)
            _get_module(model, path, f"{type(owner).__name__}.tp_plan()")
            style, segments = parse_style(value, path)
            entries.append(PlanEntry(owner_name, path, style, segments))
    return entries


def tp_divide(module: nn.Module) -> tuple[str, ...]:
    """The integer attributes ``module`` asks to have divided by the TP size: what its ``tp_divide()``
    method returns, read from the instance (a module decides at construction, e.g. a token mixer has no
    heads to split). A plain tuple attribute, as older user modules declare it, is read as it is."""
    declared = getattr(module, "tp_divide", ())
    return tuple(declared() if callable(declared) else declared)


PlanValue = str | Mapping[str, str]


def name_plan(model: nn.Module, plan: Mapping[str, PlanValue]) -> list[PlanEntry]:
    """Entries from glob patterns over module names (``"transformer.h.*.attn.c_attn": "colwise:3"``).

    A value is a style, for the modules the pattern matches, whose owner is their parent; or a
    mapping of child paths to styles, declared for the modules the pattern matches as their own
    ``tp_plan()`` would (``"encoder.layer.0.attention": {"self.query": "colwise", "output.dense":
    "rowwise"}``): they own those children, so a column-wise projection and its row-wise partner pair
    up even where they sit under different parents. Each pattern must match at least one module, and
    each child must exist; a module named twice is an error.
    """
    names = [name for name, _ in model.named_modules() if name]
    entries: dict[str, PlanEntry] = {}
    for pattern, value in plan.items():
        matched = [name for name in names if fnmatch.fnmatchcase(name, pattern)]
        if not matched:
            raise ConfigError(f"pattern {pattern!r} matches no module of {type(model).__name__}", "plan")
        if isinstance(value, Mapping):
            for owner in matched:
                for child, child_value in value.items():
                    where = f"plan.{pattern}.{child}"
                    path = join_path(owner, child)
                    _get_module(model, path, where)
                    _add_entry(entries, PlanEntry(owner, path, *parse_style(child_value, where)), where)
            continue
        style, segments = parse_style(value, f"plan.{pattern}")
        for name in matched:
            _add_entry(entries, PlanEntry(name.rpartition(".")[0], name, style, segments), f"plan.{pattern}")
    return list(entries.values())


def _add_entry(entries: dict[str, PlanEntry], entry: PlanEntry, where: str = "plan") -> None:
    if entry.path in entries:
        raise ConfigError(f"module {entry.path!r} is matched by more than one pattern", where)
    entries[entry.path] = entry


def merge_plans(base: Sequence[PlanEntry], override: Sequence[PlanEntry]) -> list[PlanEntry]:
    """``base`` with ``override``'s entries added; for a module in both, ``override`` wins."""
    replaced = {entry.path for entry in override}
    return [entry for entry in base if entry.path not in replaced] + list(override)


def check_tensor_parallel(
    model: nn.Module, entries: Sequence[PlanEntry], tp: int, whole: Set[str] = frozenset()
) -> None:
    """Raise ConfigError, naming the module and the numbers, for anything that does not split by ``tp``.

    A vocabulary (a "vocab" embedding, or the output dim of a colwise LM head) need not divide: it is
    padded inside the model (parallel/vocab_padding.py). ``whole``: paths of modules kept whole on every
    rank (parallel/parts.py), whose head counts stay.
    """
    paddable = set(_paddable_paths(model, entries))
    for entry in entries:
        module = _get_module(model, entry.path, "plan")
        if entry.style == "vocab" and not isinstance(module, nn.Embedding):
            raise ConfigError(f"vocab style needs an nn.Embedding, got {type(module).__name__}", entry.path)
        if entry.path in paddable:
            continue
        if entry.style == "colwise":
            size, what = _out_features(module)
            _check_divides(entry.path, what, size, tp * entry.segments, tp, entry.segments)
        elif entry.style == "rowwise":
            size, what = _in_features(module)
            _check_divides(entry.path, what, size, tp, tp)
    for name, module in model.named_modules():
        if name in whole:
            continue
        for attr in tp_divide(module):
            value = getattr(module, attr, None)
            if isinstance(value, int):
                _check_divides(name or type(module).__name__, attr, value, tp, tp)


def _output_paths(entries: Sequence[PlanEntry]) -> set[str]:
    """Colwise entries whose owner has no rowwise entry: their output leaves the model (the LM head)."""
    with_rowwise = {e.owner for e in entries if e.style == "rowwise"}
    return {e.path for e in entries if e.style == "colwise" and e.owner not in with_rowwise}


def _paddable_paths(model: nn.Module, entries: Sequence[PlanEntry]) -> dict[str, int]:
    """Path -> vocabulary size of every module whose rows may be padded: "vocab" embeddings and
    unpacked ``nn.Linear`` heads whose output leaves the model."""
    outputs = _output_paths(entries)
    out = {}
    for entry in entries:
        module = model.get_submodule(entry.path)
        if entry.style == "vocab" and isinstance(module, nn.Embedding):
            out[entry.path] = module.num_embeddings
        elif entry.path in outputs and entry.segments == 1 and isinstance(module, nn.Linear):
            out[entry.path] = module.out_features
    return out


def _pad_vocabularies(
    model: nn.Module, entries: Sequence[PlanEntry], tp: int, vocab_multiple: int
) -> dict[str, VocabPadding]:
    """Pad every paddable module whose vocabulary ``tp`` does not divide; path -> its padding.

    A vocabulary that ``tp`` divides keeps its exact layout.
    """
    by_size: dict[int, list[str]] = {}
    for path, size in _paddable_paths(model, entries).items():
        if size % tp:
            by_size.setdefault(size, []).append(path)
    out = {}
    for size, paths in by_size.items():
        padding = VocabPadding.for_size(size, tp, vocab_multiple)
        pad_vocabulary(model, paths, padding)
        out.update(dict.fromkeys(paths, padding))
    return out


def apply_tensor_parallel(
    model: nn.Module,
    entries: Sequence[PlanEntry],
    mesh: DeviceMesh,
    *,
    sequence_parallel: bool = False,
    divide: Mapping[str, Sequence[str]] | None = None,
    split_input: bool = True,
    whole: Set[str] = frozenset(),
    vocab_multiple: int = 64,
) -> None:
    """Shard ``model`` in place over the 1-D ``mesh`` (the "tp" dim) as ``entries`` say.

    ``divide`` maps glob patterns of module names to extra integer attributes to divide by the TP size
    (for models without ``tp_divide``, e.g. ``{"transformer.h.*.attn": ["split_size", "num_heads"]}``).
    Under ``sequence_parallel`` the model's ``layers`` (docs/architecture.md) get their input split
    on the sequence dim (unless ``split_input`` is False: a later pipeline stage, whose input arrives
    split already), and every parameter inside them must be covered by the plan. A vocabulary that
    the TP size does not divide is padded to a multiple of ``tp × vocab_multiple``.
    """
    tp = mesh.size()
    if sequence_parallel and whole:
        # The dist dict's parts are refused by ParallelConfig already; this catches `part` annotations.
        raise ConfigError(
            f"{sorted(whole)[0]} is kept whole by a part annotation, and a replicated part cannot take "
            "sequence-parallel activations (every layer must be split)",
            "sequence_parallel",
        )
    check_tensor_parallel(model, entries, tp, whole)
    for entry in entries:
        module = model.get_submodule(entry.path)
        if entry.style == "vocab" and isinstance(module, nn.Embedding):
            # First of its hooks: the range is the real vocabulary's, before any padding or sharding.
            module.register_forward_pre_hook(ids_in_range_hook(module.num_embeddings))
    paddings = _pad_vocabularies(model, entries, tp, vocab_multiple)
    for path, padding in paddings.items():
        module = model.get_submodule(path)
        if isinstance(module, nn.Embedding):  # registered before the style's own input hook
            module.register_forward_pre_hook(remap_ids_hook(padding))
    tied = _tied_parameters(model)
    by_owner: dict[str, list[PlanEntry]] = {}
    for entry in entries:
        by_owner.setdefault(entry.owner, []).append(entry)
    styles = {}
    outputs = _output_paths(entries)
    for group in by_owner.values():
        has_rowwise = any(e.style == "rowwise" for e in group)
        for entry in group:
            output = entry.path in outputs
            style = make_style(
                entry.style, segments=entry.segments, sequence_parallel=sequence_parallel, model_output=output
            )
            if style is not None:
                styles[entry.path] = style
        colwise = [e.path for e in group if e.style == "colwise"]
        if has_rowwise and colwise:
            _gather_owner_input(_get_module(model, _common_parent(colwise), "plan"), mesh, sequence_parallel)
    parallelize_module(model, mesh, styles)
    for path, padding in paddings.items():
        module = model.get_submodule(path)
        if not isinstance(module, nn.Embedding):
            module.register_forward_hook(unpad_logits_hook(padding))
    if sequence_parallel:
        _split_sequence_at_layers(model, mesh, split_input)
    _divide_attributes(model, mesh, divide or {}, whole)
    _retie(model, tied, {id(model.get_submodule(p)) for p in {e.path for e in entries} | set(whole)})


def _common_parent(paths: Sequence[str]) -> str:
    """The innermost module holding every one of ``paths``: the one whose input feeds only them
    (an owner's own input may also feed a residual, as in HF BERT's attention)."""
    parents = [path.split(".")[:-1] for path in paths]
    common = parents[0]
    for parent in parents[1:]:
        while parent[: len(common)] != common:
            common = common[:-1]
    return ".".join(common)


def _gather_owner_input(owner: nn.Module, mesh: DeviceMesh, sequence_parallel: bool) -> None:
    name = _first_parameter_name(owner)
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
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise ConfigError(
            f"sequence_parallel needs the model's `layers` ModuleList, which {type(model).__name__} lacks",
            "sequence_parallel",
        )
    for name, param in layers.named_parameters():
        if not isinstance(param, DTensor):
            raise ConfigError(
                f"layers.{name} is not covered by any tensor-parallel plan; under sequence parallel every "
                "norm must be declared 'sequence_parallel'",
                "sequence_parallel",
            )

    def split(module: nn.Module, args: tuple) -> tuple:
        x = DTensor.from_local(args[0], mesh, [Replicate()], run_check=False)
        return (x.redistribute(mesh, [Shard(1)]).to_local(), *args[1:])

    if split_input:
        # The first layer held (a pipeline stage's ModuleList keeps the model's layer indices).
        next(iter(layers)).register_forward_pre_hook(split)


def _divide_attributes(
    model: nn.Module, mesh: DeviceMesh, divide: Mapping[str, Sequence[str]], whole: Set[str]
) -> None:
    tp = mesh.size()
    names = dict(model.named_modules())
    for pattern, attrs in divide.items():
        matched = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not matched:
            raise ConfigError(f"pattern {pattern!r} matches no module", "divide")
        for name in matched:
            if name in whole:
                continue
            for attr in attrs:
                value = getattr(names[name], attr, None)
                if not isinstance(value, int):
                    raise ConfigError(f"{name}.{attr} is not an integer attribute", f"divide.{pattern}")
                _check_divides(name, attr, value, tp, tp)
                setattr(names[name], attr, value // tp)
    rank = mesh.get_local_rank()
    for name, module in names.items():
        if name in whole:
            continue
        divided = [a for a in tp_divide(module) if isinstance(getattr(module, a, None), int)]
        sizes = {getattr(module, a) for a in divided}
        for attr in divided:
            setattr(module, attr, getattr(module, attr) // tp)
        # Per-head buffers (e.g. ALiBi slopes [H]) follow the head split: this rank's contiguous slice.
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer is not None and buffer.dim() >= 1 and buffer.shape[0] in sizes:
                module._buffers[name] = buffer.chunk(tp, dim=0)[rank].clone()


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


def _get_module(model: nn.Module, path: str, where: str) -> nn.Module:
    try:
        return model.get_submodule(path)
    except AttributeError:
        raise ConfigError(
            f"{where} names {path!r}, which is not a submodule of {type(model).__name__}"
        ) from None


def _first_parameter_name(module: nn.Module) -> str:
    params = list(inspect.signature(module.forward).parameters)
    return params[0] if params else ""


def _out_features(module: nn.Module) -> tuple[int, str]:
    if isinstance(module, nn.Linear):
        return module.out_features, "out_features"
    if isinstance(module, nn.Embedding):
        return module.embedding_dim, "embedding_dim"
    if is_transposed_linear(module):
        return module.weight.shape[1], "out features"
    raise ConfigError(f"colwise needs a linear layer, got {type(module).__name__}")


def _in_features(module: nn.Module) -> tuple[int, str]:
    if isinstance(module, nn.Linear):
        return module.in_features, "in_features"
    if isinstance(module, nn.Embedding):
        return module.num_embeddings, "num_embeddings"
    if is_transposed_linear(module):
        return module.weight.shape[0], "in features"
    raise ConfigError(f"rowwise needs a linear layer, got {type(module).__name__}")


def _check_divides(path: str, what: str, value: int, by: int, tp: int, segments: int = 1) -> None:
    if value % by:
        packed = f" × {segments} packed segments" if segments > 1 else ""
        raise ConfigError(f"{what}={value} is not divisible by tensor_parallel_size={tp}{packed}", path)
