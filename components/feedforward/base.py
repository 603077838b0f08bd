"""The feedforward family: base class, registry and option checks shared by its members."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from brickwork.registry import Registry


class Feedforward(nn.Module):
    """Base of every feedforward: ``forward(x) -> y``, x and y ``[B, T, dim_model]``.

    Subclasses carry a ``Config`` dataclass with their options and keep the built one in ``config``.
    """

    Config: type
    dim_model: int

    @classmethod
    def from_config(cls, cfg: Any) -> Feedforward:
        """Build from a ``cls.Config`` instance."""
        if not isinstance(cfg, cls.Config):
            raise TypeError(f"{cls.__name__}.from_config expects {cls.__name__}.Config, got {type(cfg)!r}")
        return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})

    def check_input(self, x: torch.Tensor) -> None:
        """Raise ValueError unless x is ``[..., dim_model]``."""
        if x.shape[-1] != self.dim_model:
            raise ValueError(f"last dimension must be dim_model={self.dim_model}, got shape {tuple(x.shape)}")

    def tp_plan(self) -> dict[str, str]:
        """Tensor-parallel styles of the child modules; empty means replicated."""
        return {}


FEEDFORWARD_REGISTRY: Registry[Feedforward] = Registry("feedforward", Feedforward)


def register_feedforward(name: str) -> Callable[[type], type]:
    """Decorator registering a :class:`Feedforward` subclass under ``name``."""
    return FEEDFORWARD_REGISTRY.register(name)
