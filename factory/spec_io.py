"""Reading and writing specs as YAML (PyYAML's safe loader) or JSON (the standard library).

An exponent without a dot (``1e-5``), text to YAML 1.1, is the number it means, as in YAML 1.2; the
same loader reads command-line overrides. ``dump_spec`` writes a canonical text, so dump -> load ->
dump is byte-identical. Duplicate keys in a file are an error rather than "the last one wins".

Loading takes time linear in the file's size whatever it holds. A YAML alias is walked once however
often it is referenced, and a spec whose aliases would expand to more than ``MAX_EXPANDED_NODES``
values (a "billion laughs" bomb), an alias that refers to itself, nesting deeper than ``MAX_DEPTH``,
and text that is not UTF-8 are each a ConfigError naming the file.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from brickwork.errors import ConfigError, join_path

# A real spec has a few hundred values and nests under ten levels; these bounds leave ample room.
MAX_EXPANDED_NODES = 100_000
MAX_DEPTH = 100
FORMATS = {".yaml": "yaml", ".yml": "yaml", ".json": "json"}  # by file suffix


class SpecLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` (no tag builds an object), reading ``1e-5``, ``5E+2`` and ``.5e1`` as floats."""


SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$"), list("-+.0123456789")
)


def spec_format(path: str | os.PathLike[str]) -> str:
    """``"yaml"`` or ``"json"`` from the file suffix."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ConfigError(f"spec file {os.fspath(path)!r} has suffix {suffix!r}", choices=FORMATS)
    return FORMATS[suffix]


def load_spec(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a spec dict from a .yaml/.yml/.json file. Raises ConfigError for malformed text."""
    fmt = spec_format(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"spec file {os.fspath(path)!r} is not UTF-8 text (byte {err.start}: {err.reason})"
        ) from None
    return parse_spec(text, fmt, source=os.fspath(path))


def parse_spec(text: str, fmt: str = "yaml", source: str = "<spec>") -> dict[str, Any]:
    """Parse spec text in ``fmt`` (``"yaml"`` or ``"json"``) into a dict."""
    if fmt not in ("yaml", "json"):
        raise ConfigError(f"unknown spec format {fmt!r}", choices=["json", "yaml"], got=fmt)
    try:
        if fmt == "yaml":
            loader = SpecLoader(text)  # composed once: the nodes are checked before any is built
            if (root := loader.get_single_node()) is not None:
                _check_size(root, _yaml_children, source)
            data = None if root is None else loader.construct_document(root)
        else:
            data = json.loads(text, object_pairs_hook=functools.partial(_json_object, source))
            _check_size(data, _json_children, source)
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        raise ConfigError(f"{source} is not valid {fmt.upper()}: {err}") from None
    except RecursionError:
        raise ConfigError(f"{source} nests too deeply to read (more than {MAX_DEPTH} levels)") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source} must hold a mapping at the top level, got {type(data).__name__}")
    return data


def _check_size(root: Any, children: Callable[[Any, str, str], list], source: str) -> None:
    """Refuse ``root`` (a YAML node, or JSON data) when it nests deeper than ``MAX_DEPTH``, holds an
    alias that refers to itself, or expands to more than ``MAX_EXPANDED_NODES`` values (an alias
    bomb); ``children(node, source, path)`` lists a node's children with their key paths and refuses
    a duplicate key.

    An aliased node is the same object wherever it is referenced, so its size is computed once and
    reused (``sizes``: id -> size, or None while the node is being walked). The depth bound comes
    before Python's recursion limit.
    """
    sizes: dict[int, int | None] = {}

    def size(node: Any, path: str, depth: int) -> int:
        if (known := sizes.get(id(node), 0)) is None:
            raise ConfigError(f"{source} has an alias that refers to itself", path)
        if known:
            return known
        if depth > MAX_DEPTH:
            raise ConfigError(f"{source} nests more than {MAX_DEPTH} levels deep", path)
        sizes[id(node)] = None
        total = 1 + sum(size(child, at, depth + 1) for child, at in children(node, source, path))
        if total > MAX_EXPANDED_NODES:
            raise ConfigError(
                f"{source} expands to more than {MAX_EXPANDED_NODES:,} values, counting an alias's values "
                "wherever it is used (an alias bomb?)",
                path,
            )
        sizes[id(node)] = total
        return total

    size(root, "", 0)


def _yaml_children(node: yaml.Node, source: str, path: str) -> list[tuple[yaml.Node, str]]:
    """A node's child nodes with their key paths; duplicate mapping keys are a ConfigError."""
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        out = []
        for key_node, value_node in node.value:
            key = str(key_node.value)
            if key in seen:
                line = key_node.start_mark.line + 1
                raise ConfigError(f"key given twice in {source} (line {line})", join_path(path, key))
            seen.add(key)
            out.append((value_node, join_path(path, key)))
        return out
    if isinstance(node, yaml.SequenceNode):
        return [(item, join_path(path, i)) for i, item in enumerate(node.value)]
    return []


def _json_children(value: Any, _source: str, path: str) -> list[tuple[Any, str]]:
    """JSON has no aliases, only depth to bound (a duplicate key is found as it is read)."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return [(child, join_path(path, k)) for k, child in items]


def _json_object(source: str, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object from its key-value pairs; a key given twice is a ConfigError."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ConfigError(f"key {key!r} given twice in {source}")
        out[key] = value
    return out


def dump_spec(spec: Mapping[str, Any], path: str | os.PathLike[str]) -> str:
    """Write ``spec`` to a .yaml/.yml/.json file and return the text written: the canonical text, keys
    in their given order, block style, newline-ended."""
    fmt, data = spec_format(path), _plain(spec, "")
    if fmt == "yaml":
        text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True, width=100)
    else:
        try:
            text = json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
        except ValueError as err:
            raise ConfigError(f"cannot write the spec as JSON: {err}") from None
    Path(path).write_text(text, encoding="utf-8")
    return text


def _plain(value: Any, path: str) -> Any:
    """Check ``value`` is plain data (dicts, lists, str, int, float, bool, None) and copy it."""
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise ConfigError(f"keys must be strings or integers, got {k!r}", path)
            out[k] = _plain(v, join_path(path, str(k)))
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, join_path(path, i)) for i, v in enumerate(value)]
    if isinstance(value, float) and math.isnan(value):
        raise ConfigError("NaN cannot be written to a spec", path)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise ConfigError(f"cannot write a {type(value).__name__} to a spec file: {value!r}", path)
