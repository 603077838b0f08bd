"""``dropout=P`` on the command line sets every dropout of the model spec, not only the top-level one.

A spec's top-level ``dropout`` is the embeddings'; each attention layer, its mechanism and each
feed-forward layer have their own (``configs/bert-small.yaml`` writes 0.1 in each). A user who types
``dropout=0`` means no dropout anywhere, so the override reaches them all: the spec is resolved (every
default filled in, so each component that drops has its ``dropout`` key), and every key named
``dropout``, at any depth and in per-layer overrides too, takes the value. The run says where.
A ``dropout`` written in a spec file keeps its meaning: the embeddings' only.
"""

from __future__ import annotations

from typing import Any

from brickwork.errors import join_path
from brickwork.factory import resolve_spec
from brickwork.launch_env import is_first_rank

KEY = "dropout"


def spread_dropout(spec: dict[str, Any], value: float) -> tuple[dict[str, Any], list[str]]:
    """(the resolved ``spec`` with every ``dropout`` key set to ``value``, the dotted paths set)."""
    resolved = resolve_spec(spec)
    places: list[str] = []
    _set_every(resolved, value, "", places)
    return resolved, places


def say_spread(value: float, places: list[str]) -> None:
    """One line naming every dropout the override set (on rank 0 only, before the process group)."""
    if is_first_rank():
        print(f"dropout={value} sets every dropout of the spec ({len(places)}): {', '.join(places)}")


def _set_every(node: Any, value: float, path: str, places: list[str]) -> None:
    if isinstance(node, dict):
        for key, child in node.items():
            here = join_path(path, key)
            if key == KEY and not isinstance(child, dict | list):
                node[key] = value
                places.append(here)
            else:
                _set_every(child, value, here, places)
    elif isinstance(node, list):
        for index, child in enumerate(node):
            _set_every(child, value, join_path(path, index), places)
