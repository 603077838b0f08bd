"""A tensor-parallel plan as data: which module gets which style, and which module declared it.

A plan is a list of :class:`PlanEntry`, gathered from the components' own ``tp_plan()``
declarations (:func:`component_plan`) or from glob patterns over module names (:func:`name_plan`,
how a model brickwork did not build is sharded). An entry's *owner* is the module that declared it,
e.g. an attention layer for its q/k/v/out projections: an owner with colwise and rowwise children
pairs them, and an owner whose colwise children have no rowwise partner produces the model's output
(the LM head, :func:`output_paths`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torch import nn

from brickwork.errors import ConfigError, join_path
from brickwork.layout import PlanValue
from brickwork.parallel.tensor.styles import parse_style


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
            get_module(model, path, f"{type(owner).__name__}.tp_plan()")
            style, segments = parse_style(value, path)
            entries.append(PlanEntry(owner_name, path, style, segments))
    return entries


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
                    get_module(model, path, where)
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


def tp_divide(module: nn.Module) -> tuple[str, ...]:
    """The integer attributes ``module`` asks to have divided by the TP size: what its ``tp_divide()``
    method returns, read from the instance (a module decides at construction, e.g. a token mixer has no
    heads to split). A plain tuple attribute, as older user modules declare it, is read as it is."""
    declared = getattr(module, "tp_divide", ())
    return tuple(declared() if callable(declared) else declared)


def output_paths(entries: Sequence[PlanEntry]) -> set[str]:
    """Colwise entries whose owner has no rowwise entry: their output leaves the model (the LM head)."""
    with_rowwise = {e.owner for e in entries if e.style == "rowwise"}
    return {e.path for e in entries if e.style == "colwise" and e.owner not in with_rowwise}


def paddable_paths(model: nn.Module, entries: Sequence[PlanEntry]) -> dict[str, int]:
    """Path -> vocabulary size of every module whose rows may be padded: "vocab" embeddings and
    unpacked ``nn.Linear`` heads whose output leaves the model."""
    outputs = output_paths(entries)
    out = {}
    for entry in entries:
        module = model.get_submodule(entry.path)
        if entry.style == "vocab" and isinstance(module, nn.Embedding):
            out[entry.path] = module.num_embeddings
        elif entry.path in outputs and entry.segments == 1 and isinstance(module, nn.Linear):
            out[entry.path] = module.out_features
    return out


def get_module(model: nn.Module, path: str, where: str) -> nn.Module:
    """``model.get_submodule(path)``, or ConfigError saying that ``where`` names a module ``model`` lacks."""
    try:
        return model.get_submodule(path)
    except AttributeError:
        raise ConfigError(
            f"{where} names {path!r}, which is not a submodule of {type(model).__name__}"
        ) from None
