"""xformers' ``Feedforward`` base and its config."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from torch import nn


@dataclasses.dataclass
class FeedforwardConfig:
    name: str
    dim_model: int
    dropout: float
    activation: Any


Self = TypeVar("Self", bound="Feedforward")


class Feedforward(nn.Module):
    """Base of the feedforwards: ``forward(x)``, x ``[B, T, dim_model]``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.requires_cuda = False
        self.requires_squared_context = False

    @classmethod
    def from_config(cls: type[Self], config: Any) -> Self:
        return cls(**{k: v for k, v in dataclasses.asdict(config).items() if v is not None})
