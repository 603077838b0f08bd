"""The positional family: base class, registry and option checks shared by its members."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch

from brickwork.components.configurable import Configurable
from brickwork.registry import Registry


class PositionalEncoding(Configurable):
    """Base of every position scheme. Members follow one of three calling conventions:

    - added to embeddings (``sine``, ``learned``): ``forward(x, offset=0) -> x + pos``, x ``[B, T, d]``;
    - a hook on attention (``rotary``): ``forward(q, k, offset=0) -> (q, k)``;
    - an attention bias (``alibi``): ``forward(tq, tk, device) -> [H, tq, tk]``.

    ``offset`` is the absolute position of the first element (the KV-cache length when decoding).
    The first two also take ``positions``, a LongTensor ``[B, T]`` (or ``[1, T]``) of each element's
    own position, in place of ``offset``: where rows start at different positions, as left-padded
    rows do (HF's ``position_ids``).
    ``position_kind`` names the convention (``"additive"``, ``"rotary"`` or ``"bias"``), so the factory
    knows where a member goes.
    """

    position_kind: ClassVar[str] = "additive"


POSITIONAL_REGISTRY: Registry[PositionalEncoding] = Registry("positional", PositionalEncoding)


def register_positional(name: str) -> Callable[[type], type]:
    """Decorator registering a :class:`PositionalEncoding` subclass under ``name``."""
    return POSITIONAL_REGISTRY.register(name)


def check_positions(positions: torch.Tensor, length: int) -> torch.Tensor:
    """``positions``, checked to be integers ``[B, length]`` or ``[1, length]`` (ValueError otherwise)."""
    if not isinstance(positions, torch.Tensor) or positions.dtype.is_floating_point:
        raise ValueError(f"positions must be an integer tensor [B, T], got {positions!r}")
    if positions.dim() != 2 or positions.shape[-1] != length:
        raise ValueError(f"positions must be [B, T={length}], got shape {tuple(positions.shape)}")
    return positions


def check_offset(offset: object) -> int:
    """``offset`` as an int; ValueError unless it is a non-negative integer."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be a non-negative integer, got {offset!r}")
    return offset
