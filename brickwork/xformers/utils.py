"""xformers' registry helpers: ``Item`` entries, the registering decorator and lenient config matching."""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from collections import namedtuple
from collections.abc import Callable
from typing import Any, Self

Item = namedtuple("Item", ["constructor", "config"])


class FromConfig:
    """Gives a component xformers' ``from_config``."""

    @classmethod
    def from_config(cls, config: Any) -> Self:
        """Build from a config dataclass; None fields fall back to the constructor's defaults."""
        return cls(**{k: v for k, v in dataclasses.asdict(config).items() if v is not None})


def import_all_modules(root: str, base_module: str) -> list[str]:
    """Import every public module in folder ``root`` as ``base_module.<name>`` (registers plugins)."""
    modules: list[str] = []
    for file in sorted(os.listdir(root)):
        if file.endswith(".py") and not file.startswith("_"):
            name = f"{base_module}.{file[:-3]}"
            if name not in sys.modules:
                importlib.import_module(name)
                modules.append(name)
    return modules


def get_registry_decorator(
    class_registry: dict[str, Item], name_registry: set[str], reference_class: type, default_config: Any
) -> Callable[..., Callable[[type], type]]:
    """A ``register(name, config)`` class decorator filling ``class_registry`` with :class:`Item` s.

    Duplicate names, duplicate class names and classes not deriving from ``reference_class`` are refused."""

    def register_item(name: str, config: Any = default_config) -> Callable[[type], type]:
        def register_cls(cls: type) -> type:
            if name in class_registry:
                raise ValueError(f"Cannot register duplicate item ({name})")
            if not issubclass(cls, reference_class):
                raise ValueError(
                    f"Item ({name}: {cls.__name__}) must extend the base class: {reference_class.__name__}"
                )
            if cls.__name__ in name_registry:
                raise ValueError(f"Cannot register item with duplicate class name ({cls.__name__})")
            class_registry[name] = Item(constructor=cls, config=config)
            name_registry.add(cls.__name__)
            return cls

        return register_cls

    return register_item


def make_registry(
    reference_class: type, default_config: Any
) -> tuple[dict[str, Item], set[str], Callable[..., Callable[[type], type]], Callable[[Any], Any]]:
    """One family's registry, as xformers kept it per family: the name -> :class:`Item` dict, the set of
    registered class names, the ``register(name, config)`` decorator and the ``build(config)`` function."""
    registry: dict[str, Item] = {}
    class_names: set[str] = set()

    def build(config: dict[str, Any] | Any) -> Any:
        """The component registered as ``config["name"]``, from its config dataclass or from a dict (keys
        its config does not declare are ignored, as in xformers: :func:`generate_matching_config`)."""
        if not isinstance(config, default_config):
            config = generate_matching_config(config, registry[config["name"]].config)
        return registry[config.name].constructor.from_config(config)

    return (
        registry,
        class_names,
        get_registry_decorator(registry, class_names, reference_class, default_config),
        build,
    )


def generate_matching_config(superset: dict[str, Any], config_class: Any) -> Any:
    """``config_class`` built from the keys of ``superset`` it declares; the others are ignored (as in
    xformers, where one dict configures every component) and missing fields are None."""
    names = [f.name for f in dataclasses.fields(config_class)]
    return config_class(**{name: superset.get(name) for name in names})
