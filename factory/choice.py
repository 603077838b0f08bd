"""Registry choices in a spec: ``{name: <registered name>, <option>: <value>, ...}``.

A choice names a class in one of the component registries and gives its options, which are checked
by the class's own ``Config``. Options that the enclosing spec already fixes (the model width, the
head size, ...) are filled in by the factory and left out of the written-back spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from brickwork.components.configurable import options_dataclass
from brickwork.errors import ConfigError, join_path
from brickwork.option_types import config_fields, config_to_dict, construct, to_config
from brickwork.registry import Registry


def lookup(registry: Registry[Any], spec: Any, path: str) -> tuple[type, dict[str, Any]]:
    """The class a choice names, and the choice as a mapping (``"rmsnorm"`` is ``{"name": "rmsnorm"}``)."""
    if not isinstance(spec, str | Mapping):
        raise ConfigError(f"expected a registered name or a mapping with a 'name' key, got {spec!r}", path)
    data = {"name": spec} if isinstance(spec, str) else dict(spec)
    name_path = join_path(path, "name")
    if "name" not in data:
        raise ConfigError(
            f"missing required key 'name' (the {registry.family})", name_path, choices=registry.names()
        )
    return registry.get(data["name"], name_path), data


def configure(cls: type, data: Mapping[str, Any], path: str, **fixed: Any) -> tuple[dict, dict]:
    """(constructor options, resolved spec) of choice ``data`` for ``cls``, checked by its ``Config``;
    of ``fixed`` (``dim_model``, ``num_heads``, ...), those the Config declares are filled in."""
    options = {k: v for k, v in data.items() if k != "name"}
    fields = config_fields(options_dataclass(cls))
    fixed = {k: v for k, v in fixed.items() if k in fields}
    config = to_config(options_dataclass(cls), options, path, **fixed)
    plain = {k: v for k, v in config_to_dict(config).items() if k not in fixed}
    return {k: getattr(config, k) for k in fields}, {"name": data["name"], **plain}


def build_choice(registry: Registry[Any], spec: Any, path: str, **fixed: Any) -> tuple[Any, dict[str, Any]]:
    """(the built component, its resolved spec) of a registry choice; see :func:`configure`."""
    cls, data = lookup(registry, spec, path)
    options, resolved = configure(cls, data, path, **fixed)
    return construct(cls, path, **options), resolved


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
    return {**base, **{key: merge_spec(base.get(key), value) for key, value in override.items()}}


def diff_spec(base: Any, target: Any) -> Any:
    """The smallest override with ``merge_spec(base, diff) == target`` (both resolved specs)."""
    if not isinstance(base, Mapping) or not isinstance(target, Mapping):
        return target
    if "name" in target and target.get("name") != base.get("name"):
        return dict(target)
    return {k: diff_spec(base.get(k), v) for k, v in target.items() if k not in base or base[k] != v}
