"""Before a resume loads any weight: is the checkpoint's model the one this run builds?

A checkpoint's ``meta.json`` holds the resolved spec of the model that saved it. Weights loaded into a
model built from a different spec are wrong even when every shape fits (4 heads read as 8 splits the
same matrix differently), so any difference in a key that decides the parameters or what they mean is
an error listing those keys. Keys that change only how the model trains or runs (dropout rates, the
kernel backend, the initialisation, which the loaded weights replace) may change; so may the
``train:`` settings, and each change is reported.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from brickwork.checkpoint import META_FILE, read_meta
from brickwork.errors import ConfigError

# Spec keys (their last dotted part) that never change a parameter or its meaning.
RUNTIME_KEYS = frozenset({"dropout", "backend"})
# Top-level spec sections the loaded weights make irrelevant.
RUNTIME_SECTIONS = frozenset({"init"})
_MISSING = object()


def flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Dotted (key, leaf value) pairs of nested dicts; lists are leaves."""
    if isinstance(value, Mapping) and value:
        for key, item in value.items():
            yield from flatten(item, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, value


def differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Dotted keys whose values differ between two nested dicts (present in one only counts)."""
    old, new = dict(flatten(saved)), dict(flatten(current))
    return sorted(k for k in old.keys() | new.keys() if old.get(k, _MISSING) != new.get(k, _MISSING))


def is_runtime_key(key: str) -> bool:
    return key.split(".")[-1] in RUNTIME_KEYS or key.split(".")[0] in RUNTIME_SECTIONS


def check_resume(
    folder: Path, spec: Mapping[str, Any], settings: Mapping[str, Any], option: str = "--resume"
) -> list[str]:
    """Compare the checkpoint in ``folder`` with this run's resolved model ``spec`` and ``train:``
    ``settings``. Raises a ConfigError listing the model keys that differ; returns one line per
    changed runtime key or setting, to be reported."""
    meta = read_meta(folder)
    saved_spec = meta.get("spec")
    if not isinstance(saved_spec, Mapping):
        raise ConfigError(f"{folder / META_FILE} holds no model spec to check this run against", option)
    changed = differences(saved_spec, spec)
    model_keys = [k for k in changed if not is_runtime_key(k)]
    if model_keys:
        old, new = dict(flatten(saved_spec)), dict(flatten(spec))
        listed = ", ".join(f"{k} ({_show(old, k)} -> {_show(new, k)})" for k in model_keys)
        raise ConfigError(
            f"the model in config.yaml differs from the one {folder.name} holds, in {listed}; "
            "undo those changes in config.yaml, or start a new run",
            option,
        )
    lines = _changes(saved_spec, spec, "", folder.name)
    saved_settings = (meta.get("extra") or {}).get("train")
    if saved_settings is not None:
        lines += _changes(saved_settings, settings, "train.", folder.name)
    return lines


def _changes(saved: Mapping[str, Any], current: Mapping[str, Any], prefix: str, name: str) -> list[str]:
    old, new = dict(flatten(saved)), dict(flatten(current))
    return [
        f"{prefix}{k} changed since {name} was saved: {_show(old, k)} -> {_show(new, k)}"
        for k in differences(saved, current)
    ]


def _show(values: Mapping[str, Any], key: str) -> str:
    return repr(values[key]) if key in values else "absent"
