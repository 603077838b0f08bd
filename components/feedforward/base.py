"""The feedforward family: base class, registry and option checks shared by its members."""

from __future__ import annotations

from collections.abc import Callable

import torch

from brickwork.components.configurable import Configurable
from brickwork.registry import Registry


class Feedforward(Configurable):
    """Base of every feedforward: ``forward(x) -> y``, x and y ``[B, T, dim_model]``.

    Options are the typed ``__init__`` parameters; the built ``Config`` is kept in ``config``
    (components/configurable.py).
    """

    dim_model: int

    def check_input(self, x: torch.Tensor) -> None:
        """Raise ValueError unless x is ``[..., dim_model]``."""
        if x.shape[-1] != self.dim_model:
            raise ValueError(f"last dimension must be dim_model={self.dim_model}, got shape {tuple(x.shape)}")

    def tp_plan(self) -> dict[str, str]:
        """Tensor-parallel styles of the child modules; empty means replicated."""
        return {}

    def projections(self) -> tuple[str, ...]:
        """The child linear layers that carry the features (not routers); DeepNorm scales them."""
        return ()

    def residual_projections(self) -> tuple[str, ...]:
        """Children whose output is added back onto the residual stream (scaled by some inits)."""
        return ()


FEEDFORWARD_REGISTRY: Registry[Feedforward] = Registry("feedforward", Feedforward)


def register_feedforward(name: str) -> Callable[[type], type]:
    """Decorator registering a :class:`Feedforward` subclass under ``name``."""
    return FEEDFORWARD_REGISTRY.register(name)
