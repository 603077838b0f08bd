"""Options declared once: a component's ``__init__`` signature is its ``Config``.

Each parameter's annotation may carry its check, ``Annotated[int, check_positive_int]`` (see
:mod:`brickwork.checks` for the ready-made ones, e.g. ``PositiveInt``); rules that tie several options
together go in the class's ``check_options``. ``Config`` is a dataclass made from that signature, and
building one runs every check, so the factory checks a spec (through ``Config``) before allocating
anything, and a direct construction runs the very same checks. The built config is kept as
``config``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from typing import Annotated, Any, ClassVar, Self, Union

from torch import nn

from brickwork.option_types import check_value, type_hints


class _DerivedConfig:
    """``cls.Config``: the options dataclass of the class it is read from."""

    def __get__(self, obj: object, owner: type) -> type:
        return options_dataclass(owner)


class Configurable(nn.Module):
    """A module whose options are its constructor's parameters, checked as they come in."""

    Config: ClassVar[Any] = _DerivedConfig()
    config: Any

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None or "Config" in cls.__dict__:
            return  # inherits its parent's options, or declares its own Config by hand

        @functools.wraps(init)
        def checked_init(self: nn.Module, *args: Any, **kw: Any) -> None:
            bound = inspect.signature(init).bind(self, *args, **kw)
            bound.apply_defaults()
            config = cls.Config(**dict(list(bound.arguments.items())[1:]))  # all but self
            init(self, *args, **kw)
            # Set after the body: a subclass's call through super().__init__ must not win.
            self.config = config

        checked_init.__doc__ = init.__doc__ or cls.__doc__  # not nn.Module's, in help() and IDEs
        cls.__init__ = checked_init

    @staticmethod
    def check_options(options: Any) -> None:
        """Rules spanning several options; raise ConfigError naming one of them."""

    @classmethod
    def from_config(cls, cfg: Any) -> Self:
        """Build from a ``cls.Config`` instance."""
        if not isinstance(cfg, cls.Config):
            raise TypeError(f"{cls.__name__}.from_config expects {cls.__name__}.Config, got {type(cfg)!r}")
        return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})


def _checks(annotation: Any) -> tuple[list[Any], bool]:
    """The check callables an annotation carries, and whether None skips them (``X | None``)."""
    if typing.get_origin(annotation) is Annotated:
        return [m for m in annotation.__metadata__ if callable(m)], False
    if typing.get_origin(annotation) in (Union, types.UnionType):
        arms = typing.get_args(annotation)
        return [c for arg in arms for c in _checks(arg)[0]], type(None) in arms
    return [], False


@functools.cache
def options_dataclass(cls: type) -> type:
    """``cls.Config`` when a class declares one by hand, else the one made from its ``__init__``; for any
    class (a user's plugin need not derive from :class:`Configurable`)."""
    declared = cls.__dict__.get("Config") if issubclass(cls, Configurable) else getattr(cls, "Config", None)
    if isinstance(declared, type) and dataclasses.is_dataclass(declared):
        return declared
    init = inspect.unwrap(cls.__init__)
    hints, plain = type_hints(init, extras=True), type_hints(init)  # plain: without Annotated's checks
    fields, checks = [], {}
    for param in list(inspect.signature(init).parameters.values())[1:]:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = hints.get(param.name, Any)
        checks[param.name] = _checks(annotation)
        default = dataclasses.MISSING if param.default is param.empty else param.default
        fields.append((param.name, annotation, dataclasses.field(default=default)))
    cross = getattr(cls, "check_options", lambda options: None)

    def __post_init__(self: Any) -> None:
        for name, (field_checks, optional) in checks.items():
            value = getattr(self, name)
            if not (optional and value is None):
                for check in field_checks:
                    check(value, name)
        cross(self)
        for name in checks:  # each type last (checked, not converted): the checks above say more
            check_value(getattr(self, name), plain.get(name, Any), name)

    config = dataclasses.make_dataclass(
        f"{cls.__name__}Config", fields, namespace={"__post_init__": __post_init__}, kw_only=True
    )
    # Found again as ``cls.Config``, so configs (and modules holding them) pickle by reference.
    config.__module__, config.__qualname__ = cls.__module__, f"{cls.__qualname__}.Config"
    return config
