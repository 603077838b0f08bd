"""Activation functions by name, class, partial or callable (the ``activation`` option)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated

import torch
from torch import nn

from brickwork.errors import ConfigError


class SquaredReLU(nn.Module):
    """relu(x)² (So et al. 2021, "Primer")."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x).square()


class StarReLU(nn.Module):
    """s · relu(x)² + b with s = 0.8944, b = -0.4472 (Yu et al. 2022, "MetaFormer Baselines"): the
    constants give unit variance and zero mean for x ~ N(0, 1)."""

    scale, bias = 0.8944, -0.4472

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * torch.relu(x).square() + self.bias


class SmeLU(nn.Module):
    """Smooth ReLU (Shamir et al. 2020): 0 below -β, (x + β)² / 4β within [-β, β], x above β."""

    def __init__(self, beta: float = 2.0) -> None:
        super().__init__()
        if not beta > 0:
            raise ValueError(f"SmeLU: beta must be positive, got {beta!r}")
        self.beta = beta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        quadratic = (x + self.beta).square() / (4.0 * self.beta)
        return torch.where(x >= self.beta, x, torch.where(x <= -self.beta, torch.zeros_like(x), quadratic))

    def extra_repr(self) -> str:
        return f"beta={self.beta}"


class FunctionActivation(nn.Module):
    """Wraps a plain function ``fn(x) -> y`` as a module so it sits in the module tree."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)

    def extra_repr(self) -> str:
        return getattr(self.fn, "__name__", repr(self.fn))


ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "gelu": nn.GELU,
    "gelu_tanh": functools.partial(nn.GELU, approximate="tanh"),
    "relu": nn.ReLU,
    "squared_relu": SquaredReLU,
    "silu": nn.SiLU,
    "leaky_relu": nn.LeakyReLU,
    "smelu": SmeLU,
    "star_relu": StarReLU,
}

# Names whose GELU the feedforward can fuse with the preceding bias (brickwork.kernels.bias_gelu).
GELU_APPROXIMATION: dict[str, str] = {"gelu": "none", "gelu_tanh": "tanh"}

ActivationSpec = str | nn.Module | type | functools.partial | Callable[[torch.Tensor], torch.Tensor]


def check_activation(spec: object, option: str = "activation") -> None:
    """Raise :class:`ConfigError` unless ``spec`` is a known name, a module (class) or a callable."""
    if isinstance(spec, str):
        if spec not in ACTIVATIONS:
            raise ConfigError(f"unknown activation {spec!r}", option, choices=ACTIVATIONS, got=spec)
    elif not callable(spec):
        raise ConfigError(
            f"must be an activation name, an nn.Module (class) or a callable, got {spec!r}",
            option,
            choices=ACTIVATIONS,
        )


def create_activation(spec: ActivationSpec, option: str = "activation") -> nn.Module:
    """A fresh activation module from a name, an ``nn.Module`` class, a partial, a module or a function."""
    check_activation(spec, option)
    if isinstance(spec, str):
        return ACTIVATIONS[spec]()
    if isinstance(spec, nn.Module):
        return spec
    target = spec.func if isinstance(spec, functools.partial) else spec
    if isinstance(target, type) and issubclass(target, nn.Module):
        return spec()
    return FunctionActivation(spec)


# The annotation a component's ``activation`` option takes (components/configurable.py).
Activation = Annotated[ActivationSpec, check_activation]
