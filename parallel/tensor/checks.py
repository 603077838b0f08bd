"""What tensor parallel checks before it shards anything: every split divides, every style fits its module.

Each rule raises ConfigError naming the module and the numbers, before the first collective, so a bad
layout stops every rank with the same message.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence, Set

from torch import nn

from brickwork.errors import ConfigError
from brickwork.parallel.tensor.plan import PlanEntry, get_module, paddable_paths, tp_divide
from brickwork.parallel.tensor.styles import is_transposed_linear


def check_tensor_parallel(
    model: nn.Module, entries: Sequence[PlanEntry], tp: int, whole: Set[str] = frozenset()
) -> None:
    """Raise ConfigError, naming the module and the numbers, for anything that does not split by ``tp``.

    A vocabulary (a "vocab" embedding, or the output dim of a colwise LM head) need not divide: it is
    padded inside the model (parallel/tensor/vocab_padding.py). ``whole``: paths of modules kept whole
    on every rank (parallel/tensor/parts.py), whose head counts stay.
    """
    paddable = set(paddable_paths(model, entries))
    for entry in entries:
        module = get_module(model, entry.path, "plan")
        if entry.style == "vocab" and not isinstance(module, nn.Embedding):
            raise ConfigError(f"vocab style needs an nn.Embedding, got {type(module).__name__}", entry.path)
        if entry.path in paddable:
            continue
        if entry.style in _SPLIT:  # only colwise has packed segments (parse_style)
            size, what = _split_size(module, entry.style)
            check_divides(entry.path, what, size, tp, entry.segments)
    for name, module in model.named_modules():
        if name in whole:
            continue
        for attr in tp_divide(module):
            value = getattr(module, attr, None)
            if isinstance(value, int):
                check_divides(name or type(module).__name__, attr, value, tp)


def check_sequence_parallel(model: nn.Module, whole: Set[str]) -> None:
    """ConfigError unless sequence parallel can split every layer of ``model``: it needs the model's
    ``layers`` ModuleList, and no module of it kept whole by a ``part`` annotation."""
    if whole:
        # The dist dict's parts are refused by ParallelConfig already; this catches `part` annotations.
        raise ConfigError(
            f"{sorted(whole)[0]} is kept whole by a part annotation, and a replicated part cannot take "
            "sequence-parallel activations (every layer must be split)",
            "sequence_parallel",
        )
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise ConfigError(
            f"sequence_parallel needs the model's `layers` ModuleList, which {type(model).__name__} lacks",
            "sequence_parallel",
        )


def check_divides(path: str, what: str, value: int, tp: int, segments: int = 1) -> None:
    """ConfigError at ``path`` unless tp × ``segments`` (packed segments) divides ``what`` = ``value``."""
    if value % (tp * segments):
        packed = f" × {segments} packed segments" if segments > 1 else ""
        raise ConfigError(f"{what}={value} is not divisible by tensor_parallel_size={tp}{packed}", path)


# What each style splits: the nn.Linear attribute, the nn.Embedding one, and the weight dim of a
# transposed linear (weight [in, out]) with its name.
_SPLIT = {
    "colwise": ("out_features", "embedding_dim", 1, "out features"),
    "rowwise": ("in_features", "num_embeddings", 0, "in features"),
}


def _split_size(module: nn.Module, style: str) -> tuple[int, str]:
    """The size ``style`` splits in ``module``, and its name; ConfigError for a module that is no linear."""
    linear, embedding, dim, transposed = _SPLIT[style]
    if isinstance(module, nn.Linear | nn.Embedding):
        what = linear if isinstance(module, nn.Linear) else embedding
        return getattr(module, what), what
    if is_transposed_linear(module):
        return module.weight.shape[dim], transposed
    raise ConfigError(f"{style} needs a linear layer, got {type(module).__name__}")


def divided_attributes(
    model: nn.Module, divide: Mapping[str, Sequence[str]], tp: int, whole: Set[str]
) -> list[tuple[nn.Module, str]]:
    """(module, attribute) for every integer attribute ``divide`` names (module glob -> attribute
    names), outside the modules kept ``whole``; ConfigError for a pattern that matches nothing, an
    attribute that is not an integer, or one ``tp`` does not divide."""
    names = dict(model.named_modules())
    out = []
    for pattern, attrs in divide.items():
        matched = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not matched:
            raise ConfigError(f"pattern {pattern!r} matches no module", "divide")
        for name in (n for n in matched if n not in whole):
            for attr in attrs:
                value = getattr(names[name], attr, None)
                if not isinstance(value, int):
                    raise ConfigError(f"{name}.{attr} is not an integer attribute", f"divide.{pattern}")
                check_divides(name, attr, value, tp)
                out.append((names[name], attr))
    return out
