"""Per-part strategies: one dist dict gives different parts of a model different tensor-parallel treatment.

Whale's ``replicate`` / ``split`` scopes, as a ``parts`` mapping in the dist dict from module-path globs
to a strategy:

- ``"split"``: the part is sharded by its components' tensor-parallel plans (the default for a part
  no pattern names);
- ``"replicate"``: the part stays whole on every tensor-parallel rank (still data-parallel over the
  ``dp`` dim): its plan entries are dropped and its head counts are not divided.

A pattern is matched against whole module paths, one dotted component per glob component (``layers.*``
names ``layers.0`` and ``layers.1``, not ``layers.0.attention``), and a named module brings everything
inside it. Where a module and one of its ancestors are both named, the innermost decides; where two
patterns name the same module, the later one does. So ``{"layers.*": "replicate", "layers.3": "split"}``
keeps every layer whole except layer 3. A pattern that names no module is an error.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence

from torch import nn

from brickwork.errors import ConfigError
from brickwork.parallel.tensor_parallel import PlanEntry

PART_STRATEGIES = ("replicate", "split")


def check_parts(parts: Mapping[str, str]) -> None:
    """ConfigError, with the key path ``parts.<pattern>``, for a non-string pattern or an unknown strategy."""
    for pattern, strategy in parts.items():
        if not isinstance(pattern, str) or not pattern:
            raise ConfigError(f"a part is a module-path glob, got {pattern!r}", "parts")
        if strategy not in PART_STRATEGIES:
            raise ConfigError(
                f"unknown part strategy {strategy!r}",
                f"parts.{pattern}",
                choices=PART_STRATEGIES,
                got=strategy,
            )


def whole_modules(model: nn.Module, parts: Mapping[str, str]) -> set[str]:
    """The dotted paths of every module of ``model`` that a ``"replicate"`` part keeps whole."""
    names = [name for name, _ in model.named_modules() if name]
    decided: dict[str, str] = {}
    for pattern, strategy in parts.items():
        matched = [name for name in names if _names(pattern, name)]
        if not matched:
            where = f"parts.{pattern}"
            raise ConfigError(f"pattern {pattern!r} matches no module of {type(model).__name__}", where)
        decided.update(dict.fromkeys(matched, strategy))
    return {name for name in names if _strategy(name, decided) == "replicate"}


def _names(pattern: str, path: str) -> bool:
    """Whether the glob ``pattern`` names the module at ``path``, component by dotted component."""
    globs, parts = pattern.split("."), path.split(".")
    return len(globs) == len(parts) and all(fnmatch.fnmatchcase(p, g) for g, p in zip(globs, parts))


def _strategy(path: str, decided: Mapping[str, str]) -> str:
    """The strategy of the innermost named module among ``path`` and its ancestors; "split" if none."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        strategy = decided.get(".".join(parts[:end]))
        if strategy is not None:
            return strategy
    return "split"


def keep_whole(entries: Sequence[PlanEntry], whole: set[str]) -> list[PlanEntry]:
    """``entries`` without those for modules kept whole: those modules keep their full weights."""
    return [entry for entry in entries if entry.path not in whole]
