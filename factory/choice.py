"""Registry choices in a spec: ``{name: <registered name>, <option>: <value>, ...}``.

A choice names a class in one of the component registries and gives its options, which are checked
against the class's ``Config`` dataclass. Options that the enclosing spec already fixes (the model
width, the head size, ...) are filled in by the factory and left out of the written-back spec.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from brickwork.components.configurable import options_dataclass
from brickwork.errors import ConfigError, join_path
from brickwork.factory.convert import config_fields, config_to_dict, construct, to_config
from brickwork.registry import Registry


@dataclass(frozen=True)
class Choice:
    """A checked registry choice: the name, the class and its ``Config`` instance."""

    name: str
    cls: type
    config: Any
    path: str
    fixed: tuple[str, ...] = ()

    def options(self, *, include_fixed: bool = True) -> dict[str, Any]:
        """The constructor keyword arguments (with or without the fields the factory fixed)."""
        return {
            k: getattr(self.config, k)
            for k in config_fields(type(self.config))
            if include_fixed or k not in self.fixed
        }

    def to_spec(self) -> dict[str, Any]:
        """``{name, **options}`` without the fixed fields: the form written back into a spec."""
        plain = config_to_dict(self.config)
        return {"name": self.name, **{k: v for k, v in plain.items() if k not in self.fixed}}

    def build(self, **extra: Any) -> Any:
        """``cls(**options, **extra)``, with errors re-raised as ConfigError at this choice's path."""
        return construct(self.cls, self.path, **self.options(), **extra)

    def partial(self) -> functools.partial:
        """``functools.partial(cls, **options)`` for layers the block builds itself (norms)."""
        return functools.partial(self.cls, **self.options())


def normalize_choice(spec: Any, path: str) -> dict[str, Any]:
    """A choice as a mapping: the string shorthand ``"rmsnorm"`` becomes ``{"name": "rmsnorm"}``."""
    if isinstance(spec, str):
        return {"name": spec}
    if isinstance(spec, Mapping):
        return dict(spec)
    raise ConfigError(f"expected a registered name or a mapping with a 'name' key, got {spec!r}", path)


def resolve_choice(
    registry: Registry[Any], spec: Any, path: str, context: Mapping[str, Any] | None = None
) -> Choice:
    """Check ``spec`` (a name or ``{name, **options}``) against ``registry`` and the class's Config.

    ``context`` holds values the enclosing spec determines (``dim_model``, ``num_heads``, ...); those
    a Config declares are filled in and may only be repeated in ``spec`` with the same value.
    """
    data = normalize_choice(spec, path)
    if "name" not in data:
        raise ConfigError(
            f"missing required key 'name' (the {registry.family})",
            join_path(path, "name"),
            choices=registry.names(),
        )
    name = data.pop("name")
    cls = registry.get(name, join_path(path, "name"))
    config_cls = options_dataclass(cls)
    fields = config_fields(config_cls)
    fixed = {k: v for k, v in (context or {}).items() if k in fields}
    config = to_config(config_cls, data, path, **fixed)
    return Choice(name, cls, config, path, tuple(fixed))


def merge_spec(base: Any, override: Any) -> Any:
    """``override`` laid over ``base`` (both left unchanged).

    Mappings merge key by key. A registry choice whose ``name`` changes is replaced as a whole, since
    the old component's options mean nothing to the new one.
    """
    if isinstance(base, str) and isinstance(override, Mapping) and "name" not in override:
        base = {"name": base}  # a choice given by name alone, now given options
    if not isinstance(base, Mapping) or not isinstance(override, Mapping):
        return override
    if "name" in override and "name" in base and override["name"] != base["name"]:
        return dict(override)
    out = dict(base)
    for key, value in override.items():
        out[key] = merge_spec(base[key], value) if key in base else value
    return out


def diff_spec(base: Any, target: Any) -> Any:
    """The smallest override with ``merge_spec(base, diff) == target`` (both resolved specs)."""
    if not isinstance(base, Mapping) or not isinstance(target, Mapping):
        return target
    if "name" in target and target.get("name") != base.get("name"):
        return dict(target)
    out = {}
    for key, value in target.items():
        if key not in base:
            out[key] = value
        elif base[key] != value:
            out[key] = diff_spec(base[key], value)
    return out
