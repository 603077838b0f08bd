"""LayerNorm and RMSNorm modules over the fused kernels, and the norm registry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from brickwork import kernels
from brickwork.checks import check_bool, check_positive_float, check_positive_int
from brickwork.components.configurable import Configurable
from brickwork.errors import ConfigError
from brickwork.registry import Registry

NORM_REGISTRY: Registry[nn.Module] = Registry("norm", nn.Module)
BACKENDS = ("torch", "triton")


def register_norm(name: str) -> Callable[[type], type]:
    """Decorator registering a norm (an ``nn.Module`` built as ``cls(dim, ...)``) under ``name``."""
    return NORM_REGISTRY.register(name)


def check_backend(value: object) -> None:
    if value is not None and value not in BACKENDS:
        raise ConfigError(
            f"unknown kernel backend {value!r} (null picks by device)", "backend", BACKENDS, value
        )


class _Norm(Configurable):
    """Shared plumbing: the input width check (``from_config`` comes from :class:`Configurable`)."""

    dim: int

    def check_input(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.dim:
            raise ValueError(f"last dimension must be dim={self.dim}, got shape {tuple(x.shape)}")


@register_norm("layernorm")
class LayerNorm(_Norm):
    """LayerNorm over the last dimension via :func:`brickwork.kernels.layer_norm`; x ``[..., dim]``.

    Parameters ``weight`` ``[dim]`` (ones) and, with ``bias``, ``bias`` ``[dim]`` (zeros). ``backend``
    (None | "torch" | "triton") is passed to the kernel; None picks Triton for CUDA tensors.
    """

    @dataclass
    class Config:
        dim: int
        eps: float = 1e-5
        bias: bool = True
        backend: str | None = None

        def __post_init__(self) -> None:
            check_positive_int(self.dim, "dim")
            check_positive_float(self.eps, "eps")
            check_bool(self.bias, "bias")
            check_backend(self.backend)

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True, backend: str | None = None) -> None:
        super().__init__()
        self.Config(dim, eps, bias, backend)
        self.dim, self.eps, self.backend = dim, float(eps), backend
        self.weight = nn.Parameter(torch.empty(dim))
        self.bias = nn.Parameter(torch.empty(dim)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return kernels.layer_norm(x, self.weight, self.bias, self.eps, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, bias={self.bias is not None}"


@register_norm("rmsnorm")
class RMSNorm(_Norm):
    """RMSNorm (Zhang & Sennrich 2019) over the last dimension via :func:`brickwork.kernels.rms_norm`:
    ``x / sqrt(mean(x²) + eps) * weight``; x ``[..., dim]``, parameter ``weight`` ``[dim]`` (ones)."""

    @dataclass
    class Config:
        dim: int
        eps: float = 1e-6
        backend: str | None = None

        def __post_init__(self) -> None:
            check_positive_int(self.dim, "dim")
            check_positive_float(self.eps, "eps")
            check_backend(self.backend)

    def __init__(self, dim: int, eps: float = 1e-6, backend: str | None = None) -> None:
        super().__init__()
        self.Config(dim, eps, backend)
        self.dim, self.eps, self.backend = dim, float(eps), backend
        self.weight = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        return kernels.rms_norm(x, self.weight, self.eps, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"
