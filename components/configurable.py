"""The base every component family shares: a ``Config`` dataclass and ``from_config``."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Self

from torch import nn


class Configurable(nn.Module):
    """A module whose constructor takes exactly the fields of its ``Config`` dataclass."""

    Config: ClassVar[type]

    @classmethod
    def from_config(cls, cfg: Any) -> Self:
        """Build from a ``cls.Config`` instance."""
        if not isinstance(cfg, cls.Config):
            raise TypeError(f"{cls.__name__}.from_config expects {cls.__name__}.Config, got {type(cfg)!r}")
        return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})
