"""The residual-style family: base class, registry and option checks shared by the residual folder."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from brickwork.components.configurable import Configurable
from brickwork.registry import Registry

Norm = Callable[[torch.Tensor], torch.Tensor] | None
Branch = tuple[Norm, Callable[[torch.Tensor], torch.Tensor]]


class ResidualStyle(Configurable):
    """How a block's branches join the residual stream: ``forward(x, branches) -> x``.

    ``branches`` is a sequence of ``(norm, fn)`` pairs run in order (attention, then feedforward, ...);
    ``norm`` may be ``None`` for no norm. x ``[B, T, d]``. Styles hold no parameters: the norms belong to
    the block, so their names and weights stay the same whichever style is chosen.
    """

    def __init__(self) -> None:
        """A residual style takes no options (see the class's docstring for what it computes)."""
        super().__init__()

    def forward(self, x: torch.Tensor, branches: Sequence[Branch]) -> torch.Tensor:
        raise NotImplementedError


RESIDUAL_REGISTRY: Registry[ResidualStyle] = Registry("residual", ResidualStyle)


def register_residual(name: str) -> Callable[[type], type]:
    """Decorator registering a :class:`ResidualStyle` subclass under ``name``."""
    return RESIDUAL_REGISTRY.register(name)


def apply_norm(norm: Norm, x: torch.Tensor) -> torch.Tensor:
    return x if norm is None else norm(x)
