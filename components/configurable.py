"""Options declared once: a component's ``__init__`` signature is its ``Config``, a
:class:`~brickwork.option_types.CheckedConfig` of its parameters whose rules spanning options are the
class's static ``check_options(options)``, if any. The built config is kept as ``config``."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, ClassVar, Self

from torch import nn

from brickwork.option_types import CheckedConfig, type_hints


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

    @classmethod
    def from_config(cls, cfg: Any) -> Self:
        """Build from a ``cls.Config`` instance."""
        if not isinstance(cfg, cls.Config):
            raise TypeError(f"{cls.__name__}.from_config expects {cls.__name__}.Config, got {type(cfg)!r}")
        return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})


@functools.cache
def options_dataclass(cls: type) -> type:
    """``cls.Config`` when a class declares one by hand, else the one made from its ``__init__``; for any
    class (a user's plugin need not derive from :class:`Configurable`)."""
    declared = cls.__dict__.get("Config") if issubclass(cls, Configurable) else getattr(cls, "Config", None)
    if isinstance(declared, type) and dataclasses.is_dataclass(declared):
        return declared
    init = inspect.unwrap(cls.__init__)
    hints, fields = type_hints(init, extras=True), []
    for param in list(inspect.signature(init).parameters.values())[1:]:
        if param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            default = dataclasses.MISSING if param.default is param.empty else param.default
            fields.append((param.name, hints.get(param.name, Any), dataclasses.field(default=default)))
    namespace = {"check_options": lambda options: getattr(cls, "check_options", lambda _: None)(options)}
    name, bases = f"{cls.__name__}Config", (CheckedConfig,)
    config = dataclasses.make_dataclass(name, fields, bases=bases, namespace=namespace, kw_only=True)
    # Found again as ``cls.Config``, so configs (and modules holding them) pickle by reference.
    config.__module__, config.__qualname__ = cls.__module__, f"{cls.__qualname__}.Config"
    return config
