"""The positional family: base class, registry and option checks shared by its members."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from torch import nn

from brickwork.registry import Registry


class PositionalEncoding(nn.Module):
    """Base of every position scheme. Members follow one of three calling conventions:

    - added to embeddings (``sine``, ``learned``): ``forward(x, offset=0) -> x + pos``, x ``[B, T, d]``;
    - a hook on attention (``rotary``): ``forward(q, k, offset=0) -> (q, k)``;
    - an attention bias (``alibi``): ``forward(tq, tk, device) -> [H, tq, tk]``.

    ``offset`` is the absolute position of the first element (the KV-cache length when decoding).
    """

    Config: type

    @classmethod
    def from_config(cls, cfg: Any) -> PositionalEncoding:
        """Build from a ``cls.Config`` instance."""
        if not isinstance(cfg, cls.Config):
            raise TypeError(f"{cls.__name__}.from_config expects {cls.__name__}.Config, got {type(cfg)!r}")
        return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})


POSITIONAL_REGISTRY: Registry[PositionalEncoding] = Registry("positional", PositionalEncoding)


def register_positional(name: str) -> Callable[[type], type]:
    """Decorator registering a :class:`PositionalEncoding` subclass under ``name``."""
    return POSITIONAL_REGISTRY.register(name)


def check_offset(offset: object) -> int:
    """``offset`` as an int; ValueError unless it is a non-negative integer."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be a non-negative integer, got {offset!r}")
    return offset
