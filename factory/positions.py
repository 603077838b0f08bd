"""The spec's ``position``: one choice or a list, split into what is added to the embeddings and what
each self-attention layer takes (a rotary hook, an attention bias)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from brickwork.components.positional import POSITIONAL_REGISTRY
from brickwork.errors import ConfigError, join_path
from brickwork.factory.choice import lookup

NO_POSITION = "none"
Position = tuple[type, dict[str, Any], str]  # a position choice: its class, its spec, its key path


def split_positions(value: Any, path: str = "position") -> tuple[list[Position], list[Position]]:
    """(additive, attention-side) position choices of ``position``: null, ``none``, one choice, or a list
    with at most one of each kind, e.g. ``[{name: learned}, {name: rotary}]``."""
    if isinstance(value, Mapping) and value.get("name") == NO_POSITION and len(value) > 1:
        raise ConfigError("position 'none' takes no options", path)
    if value in (None, NO_POSITION, {"name": NO_POSITION}):
        return [], []
    items = list(enumerate(value)) if isinstance(value, list) else [(None, value)]
    additive, hooks, seen = [], [], {}
    for index, item in items:
        item_path = join_path(path, index)
        cls, spec = lookup(POSITIONAL_REGISTRY, item, item_path)
        kind = cls.position_kind
        if kind in seen:
            raise ConfigError(f"two {kind} positions ({seen[kind]} and {item_path}); keep one", item_path)
        seen[kind] = item_path
        (additive if kind == "additive" else hooks).append((cls, spec, item_path))
    return additive, hooks


def positions_spec(additive: dict[str, Any] | None, hooks: list[dict[str, Any]] | None) -> Any:
    """The resolved ``position``: ``{name: none}``, one choice, or the list of them."""
    chosen = ([additive] if additive is not None else []) + list(hooks or [])
    if not chosen:
        return {"name": NO_POSITION}
    return chosen[0] if len(chosen) == 1 else chosen
