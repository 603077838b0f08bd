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

The same strategies can be written in the model's code, as Whale's scopes and EPL's annotations are:
inside ``with part("replicate"):`` every module assigned as a submodule (an attribute assignment,
``add_module``, a ``ModuleList`` built there) carries the strategy, and so does everything inside it;
the innermost open block decides, and a module keeps the strategy it got first. ``parallelize`` reads
these annotations as if they were ``parts`` entries for those modules, and the dist dict wins: a
``parts`` pattern overrides every annotation on the module it names and inside it.
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Iterator, Mapping

from torch import nn
from torch.nn.modules.module import register_module_module_registration_hook
from torch.utils.hooks import RemovableHandle

from brickwork.errors import ConfigError

PART_STRATEGIES = ("replicate", "split")
PART_ATTR = "_brickwork_part"

# The strategies of the open ``part`` blocks, innermost last, and the registration hook while any is open.
_open: list[str] = []
_hook: list[RemovableHandle] = []


@contextlib.contextmanager
def part(strategy: str) -> Iterator[None]:
    """Give every module assigned as a submodule inside the block ``strategy`` ("replicate" or
    "split"), for ``parallelize`` to read as a ``parts`` entry. ConfigError for an unknown strategy.

    ``with part("replicate"): self.head = nn.Linear(dim, classes)`` in a model's ``__init__``."""
    _check_strategy(strategy, "part")
    if not _open:
        _hook.append(register_module_module_registration_hook(_mark))
    _open.append(strategy)
    try:
        yield
    finally:
        _open.pop()
        if not _open:
            _hook.pop().remove()


def _mark(parent: nn.Module, name: str, module: nn.Module | None) -> None:
    if module is not None and getattr(module, PART_ATTR, None) is None:
        setattr(module, PART_ATTR, _open[-1])


def annotated_parts(model: nn.Module) -> dict[str, str]:
    """Path -> strategy of every module of ``model`` (not ``model`` itself) that a ``part`` block marked."""
    out = {}
    for name, module in model.named_modules():
        strategy = getattr(module, PART_ATTR, None)
        if name and strategy is not None:
            out[name] = strategy
    return out


def _check_strategy(strategy: object, where: str) -> None:
    if strategy not in PART_STRATEGIES:
        raise ConfigError(f"unknown part strategy {strategy!r}", where, choices=PART_STRATEGIES, got=strategy)


def check_parts(parts: Mapping[str, str]) -> None:
    """ConfigError, with the key path ``parts.<pattern>``, for a non-string pattern or an unknown strategy."""
    for pattern, strategy in parts.items():
        if not isinstance(pattern, str) or not pattern:
            raise ConfigError(f"a part is a module-path glob, got {pattern!r}", "parts")
        _check_strategy(strategy, f"parts.{pattern}")


def whole_modules(model: nn.Module, parts: Mapping[str, str]) -> set[str]:
    """The dotted paths of every module of ``model`` that a ``"replicate"`` part keeps whole: from the
    ``parts`` patterns and the ``part`` annotations, the patterns winning over the annotations at and
    inside the modules they name."""
    names = [name for name, _ in model.named_modules() if name]
    named: dict[str, str] = {}
    for pattern, strategy in parts.items():
        matched = [name for name in names if _names(pattern, name)]
        if not matched:
            where = f"parts.{pattern}"
            raise ConfigError(f"pattern {pattern!r} matches no module of {type(model).__name__}", where)
        named.update(dict.fromkeys(matched, strategy))
    annotated = {
        path: strategy
        for path, strategy in annotated_parts(model).items()
        if not any(path == n or path.startswith(f"{n}.") for n in named)
    }
    decided = {**annotated, **named}
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
