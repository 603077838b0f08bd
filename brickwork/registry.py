"""One helper that makes every registry: the component families' (attention, feedforward, ...), the tasks'."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from brickwork.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> class for one component family.

    Rejects duplicate names and classes that do not derive from ``base``. Lookups of unknown names
    raise :class:`ConfigError` listing every registered name and the closest one.
    """

    def __init__(self, family: str, base: type) -> None:
        self.family = family
        self.base = base
        self._entries: dict[str, type[T]] = {}

    def register(self, name: str, cls: type[T] | None = None) -> Callable[[type[T]], type[T]] | type[T]:
        """Register ``cls`` under ``name``; usable as ``@REGISTRY.register("name")``."""

        def add(c: type[T]) -> type[T]:
            if not isinstance(name, str) or not name:
                raise ValueError(f"{self.family} registry: name must be a non-empty string, got {name!r}")
            if name in self._entries:
                taken = self._entries[name].__qualname__
                raise ValueError(f"{self.family} registry: {name!r} is already registered to {taken}")
            if not (isinstance(c, type) and issubclass(c, self.base)):
                base = self.base.__qualname__
                raise TypeError(f"{self.family} registry: {c!r} registered as {name!r} must subclass {base}")
            self._entries[name] = c
            return c

        return add(cls) if cls is not None else add

    def unregister(self, name: str) -> type[T]:
        """Remove ``name`` (e.g. a plugin registered for one test); returns its class."""
        if name not in self._entries:
            raise KeyError(f"{self.family} registry: {name!r} is not registered")
        return self._entries.pop(name)

    def get(self, name: str, path: str | None = None) -> type[T]:
        """The class registered as ``name``; ``path`` is the spec key path used in errors."""
        if not isinstance(name, str):
            raise ConfigError(f"{self.family} name must be a string, got {name!r}", path)
        if name not in self._entries:
            raise ConfigError(f"unknown {self.family} {name!r}", path, choices=self._entries.keys(), got=name)
        return self._entries[name]

    def build(self, spec: str | type | functools.partial | Any, path: str | None = None, **kwargs: Any) -> T:
        """Resolve a pluggable layer given as a registered name, a class or a ``functools.partial``.

        An already built instance of ``base`` is returned as it is.
        """
        if isinstance(spec, self.base):
            return spec
        if isinstance(spec, str):
            spec = self.get(spec, path)
        if isinstance(spec, functools.partial) or (isinstance(spec, type) and issubclass(spec, self.base)):
            return spec(**kwargs)
        raise ConfigError(
            f"{self.family} must be a registered name, a {self.base.__qualname__} subclass or a "
            f"functools.partial, got {spec!r}",
            path,
            choices=self._entries.keys(),
        )

    def names(self) -> list[str]:
        return sorted(self._entries)

    keys = names  # as xformers' registries (and tests parametrized over ``REGISTRY.keys()``) spell it

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)
