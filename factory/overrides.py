"""Command-line style dotted overrides: ``decoder.num_layers=4``, ``position={name: rotary}``.

The value is read as YAML by the spec files' own loader, so ``4`` is an int, ``1e-3`` a float,
``true`` a bool, ``null`` None and ``{name: local, window_size: 64}`` a mapping. Assigning a mapping
replaces the whole value at that key; to change one option, name its full path.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from brickwork.errors import ConfigError, join_path
from brickwork.factory.spec_io import SpecLoader


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"a.b=1"`` -> (["a", "b"], 1)."""
    if not isinstance(text, str):
        raise ConfigError(f"an override must be a string 'dotted.key=value', got {text!r}")
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {text!r} is not of the form 'dotted.key=value'")
    parts = key.split(".")
    if any(not p for p in parts):
        raise ConfigError(f"override {text!r} has an empty key segment", key)
    try:
        value = yaml.load(raw, Loader=SpecLoader)  # SpecLoader is a SafeLoader
    except yaml.YAMLError as err:
        raise ConfigError(f"the value {raw!r} is not valid YAML: {err}", key) from None
    return parts, value


def set_dotted(spec: dict[str, Any], parts: list[str], value: Any) -> None:
    """Set ``spec[p0][p1]...`` to ``value`` in place, creating mappings on the way."""
    node: Any = spec
    for depth, part in enumerate(parts):
        here = join_path(*parts[: depth + 1])
        if not isinstance(node, dict):
            parent = join_path(*parts[:depth])
            raise ConfigError(f"cannot set {here!r}: {parent!r} holds {node!r}, not a mapping", here)
        key = _existing_key(node, part)
        if depth == len(parts) - 1:
            node[key] = copy.deepcopy(value)
            return
        if key not in node or node[key] is None:
            node[key] = {}
        node = node[key]


def _existing_key(node: Mapping[Any, Any], part: str) -> Any:
    """The key of ``node`` that ``part`` names: the string itself, or the integer it spells."""
    if part in node:
        return part
    try:
        number = int(part)
    except ValueError:
        return part
    return number if number in node or str(number) == part else part


def with_overrides(spec: Mapping[str, Any], overrides: Iterable[str] | Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``spec`` with dotted ``overrides`` (``"dotted.key=value"`` strings, or a mapping
    ``{"dotted.key": value}``) applied, unchecked: ``apply_overrides`` checks the result."""
    if not isinstance(spec, Mapping):
        raise ConfigError(f"a spec must be a mapping, got {type(spec).__name__}")
    out = copy.deepcopy(dict(spec))
    if isinstance(overrides, str):
        raise ConfigError(
            f"overrides must be a list of 'dotted.key=value' strings, got the string {overrides!r}"
        )
    if isinstance(overrides, Mapping):
        items = [(str(k).split("."), v) for k, v in overrides.items()]
    else:
        items = [parse_override(text) for text in overrides]
    for parts, value in items:
        set_dotted(out, parts, value)
    return out
