"""The one type checker, ``check_value``; ``CheckedConfig``, the one way a config checks its fields;
``to_config``: a spec mapping into a typed dataclass; and back."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, TypeVar, Union

from brickwork.errors import ConfigError, join_path

C = TypeVar("C")


@functools.cache
def config_fields(cls: type) -> dict[str, Any]:
    """The settable fields of dataclass ``cls``, each with its resolved annotation."""
    hints = type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")]
    return {f.name: hints.get(f.name, Any) for f in fields}


class CheckedConfig:
    """The base of every config dataclass: building one runs each field's ``Annotated`` checks (None passes
    an optional field), then ``check_options``, then checks each type, unconverted (the first say more)."""

    def __post_init__(self) -> None:
        fields = field_checks(type(self))
        for name, checks, optional, _ in fields:
            for check in () if optional and getattr(self, name) is None else checks:
                check(getattr(self, name), name)
        self.check_options()
        for name, _, optional, annotation in fields:
            if type(value := getattr(self, name)) is not annotation and not (optional and value is None):
                check_value(value, annotation, name)

    def check_options(self) -> None:
        """Rules spanning several fields; raise ConfigError naming one of them."""


@functools.cache
def field_checks(cls: type) -> list[tuple[str, list[Any], bool, Any]]:
    """Per field of ``cls``: name, ``Annotated`` checks, whether None passes (``X | None``), plain type."""
    hints, fields = type_hints(cls, extras=True), []
    for name, plain in config_fields(cls).items():
        hint = hints.get(name, Any)
        arms = typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else (hint,)
        checks = [c for a in arms if typing.get_origin(a) is Annotated for c in a.__metadata__ if callable(c)]
        fields.append((name, checks, types.NoneType in arms, plain))
    return fields


def type_hints(obj: Any, extras: bool = False) -> dict[str, Any]:
    """``obj``'s resolved annotations, or none if one names a type-checking-only import (any value passes)."""
    try:
        return typing.get_type_hints(obj, include_extras=extras)
    except (NameError, TypeError):
        return {}


def to_config(cls: type[C], data: Any, path: str = "", /, **fixed: Any) -> C:
    """Convert mapping ``data`` into dataclass ``cls``, checking keys, types and values.

    ``fixed`` are values the caller supplies (e.g. a model dim); ``data`` may only repeat them. The
    leading parameters are positional-only, so a dataclass may have fields named ``data`` or ``path``.
    """
    fields = config_fields(cls)
    settable = [name for name in fields if name not in fixed]
    if not isinstance(data, Mapping):
        keys = f"keys ({', '.join(settable)})" if settable else "no keys"
        raise ConfigError(f"expected a mapping of {keys}, got {_show(data)}", path)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        key_path = join_path(path, str(key))
        if key in fixed:
            if value != fixed[key] or type(value) is not type(fixed[key]):
                raise ConfigError(f"is set to {fixed[key]!r} by the enclosing spec, got {value!r}", key_path)
        elif key in fields:
            kwargs[key] = check_value(value, fields[key], key_path)
        else:
            raise ConfigError(f"unknown key {key!r}", key_path, choices=settable, got=key)
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and f.name in settable and f.name not in kwargs:
            raise ConfigError("missing required key", join_path(path, f.name))
    return construct(cls, path, **kwargs, **fixed)


def construct(
    cls: Callable[..., C], path: str, sources: Mapping[str, str] | None = None, /, **kwargs: Any
) -> C:
    """``cls(**kwargs)`` with its value checks re-raised as ConfigError under ``path``.

    ``sources`` names the spec key that set an argument the factory passes (``rotary`` is set by
    ``position``): an error about that argument is filed there.
    """
    try:
        return cls(**kwargs)
    except ConfigError as err:
        raise err.at(path, sources) from None
    except (ValueError, TypeError) as err:
        raise ConfigError(str(err), path) from err


def check_value(value: Any, annotation: Any, path: str) -> Any:
    """``value`` if it fits ``annotation`` (converted: int -> float, list -> tuple, dict -> dataclass)."""
    if type(value) is annotation or annotation is Any or annotation is object:
        return value  # first: the common case, checked on every config built
    if typing.get_origin(annotation) is Callable or getattr(annotation, "_is_protocol", False):
        annotation = Callable  # a hook, typed by its call (a Protocol): any callable will do
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Union or origin is types.UnionType:
        return value if value is None and types.NoneType in args else _check_union(value, args, path)
    if origin is Literal:
        if value in args and all(type(value) is type(a) for a in args if a == value):
            return value
        raise ConfigError(f"invalid value {value!r}", path, choices=[str(a) for a in args], got=value)
    if annotation is None or annotation is types.NoneType:
        if value is None:
            return None
        raise ConfigError(f"expected null, got {_show(value)}", path)
    if origin in (list, tuple, Sequence):
        return _check_sequence(value, origin, args, path)
    if origin in (dict, typing.Mapping, Mapping):
        return _check_mapping(value, args, path)
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return value if isinstance(value, annotation) else to_config(annotation, value, path)
    if origin is not None or not isinstance(annotation, type):
        return value  # a form no spec uses (type[X], a TypeVar): not checked
    accepted = (int, float) if annotation is float else annotation  # an int is a valid float
    # Python's bool is an int, but a spec's true is no number.
    if isinstance(value, accepted) and not (isinstance(value, bool) and annotation is not bool):
        return float(value) if annotation is float else value
    raise ConfigError(f"expected {type_name(annotation)}, got {_show(value)}", path)


def _check_union(value: Any, args: tuple[Any, ...], path: str) -> Any:
    errors: list[ConfigError] = []
    for arg in args:
        try:
            return check_value(value, arg, path)
        except ConfigError as err:
            errors.append(err)
    # When the value had the right kind for one arm (a mapping for a dataclass, say) and failed
    # inside it, that inner error is the useful one.
    deeper = [e for e in errors if e.path != path]
    if len(deeper) == 1:
        raise deeper[0]
    raise ConfigError(f"expected {' | '.join(map(type_name, args))}, got {_show(value)}", path)


def _check_sequence(value: Any, origin: Any, args: tuple[Any, ...], path: str) -> Any:
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"expected a list, got {_show(value)}", path)
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        if len(value) != len(args):
            raise ConfigError(f"expected a list of {len(args)} items, got {len(value)}", path)
        return tuple(check_value(v, a, join_path(path, i)) for i, (v, a) in enumerate(zip(value, args)))
    item = args[0] if args else Any
    items = [check_value(v, item, join_path(path, i)) for i, v in enumerate(value)]
    return tuple(items) if origin is tuple else items


def _check_mapping(value: Any, args: tuple[Any, ...], path: str) -> dict[Any, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"expected a mapping, got {_show(value)}", path)
    key_type, value_type = args if args else (Any, Any)
    return {
        check_value(k, key_type, join_path(path, str(k))): check_value(v, value_type, join_path(path, str(k)))
        for k, v in value.items()
    }


def type_name(annotation: Any) -> str:
    """A short readable name for an annotation: ``int``, ``float | null``, ``list[int]``."""
    if annotation is None or annotation is types.NoneType:
        return "null"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Union or origin is types.UnionType:
        return " | ".join(type_name(a) for a in args)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else type_name(a) for a in args)
        base = "list" if origin in (list, tuple) else "mapping" if origin in (dict, Mapping) else "sequence"
        return f"{base}[{inner}]" if inner else base
    if dataclasses.is_dataclass(annotation):
        return "mapping"
    return getattr(annotation, "__name__", str(annotation))


def _show(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def config_to_dict(config: Any) -> dict[str, Any]:
    """The plain-data form of a config dataclass: nested dataclasses as dicts, tuples as lists."""
    return {name: to_plain(getattr(config, name)) for name in config_fields(type(config))}


def to_plain(value: Any) -> Any:
    """``value`` as YAML/JSON-ready data (dataclasses -> dicts, tuples -> lists)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return config_to_dict(value)
    if isinstance(value, Mapping):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value
