"""xformers' ``Activation`` names, built by brickwork's activation registry."""

from __future__ import annotations

from enum import Enum

from torch import nn

from brickwork.components.feedforward.activations import create_activation


class Activation(str, Enum):
    SquaredReLU = "squared_relu"
    GeLU = "gelu"
    LeakyReLU = "leaky_relu"
    ReLU = "relu"
    SmeLU = "smelu"
    StarReLU = "star_relu"


def build_activation(activation: Activation | str | None) -> nn.Module:
    """The activation module for an xformers name; none given means identity."""
    if not activation:
        return nn.Identity()
    return create_activation(Activation(activation).value)
