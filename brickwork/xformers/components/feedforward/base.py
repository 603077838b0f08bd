"""xformers' ``Feedforward`` base and its config."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from brickwork.xformers.utils import FromConfig


@dataclasses.dataclass
class FeedforwardConfig:
    name: str
    dim_model: int
    dropout: float
    activation: Any


class Feedforward(FromConfig, nn.Module):
    """Base of the feedforwards: ``forward(x)``, x ``[B, T, dim_model]``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.requires_cuda = False
        self.requires_squared_context = False
