"""LayerNorm and RMSNorm modules over the fused kernels, and the norm registry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import nn

from brickwork import kernels
from brickwork.checks import Flag, PositiveFloat, PositiveInt
from brickwork.components.configurable import Configurable
from brickwork.kernels.backend import check_backend
from brickwork.registry import Registry

NORM_REGISTRY: Registry[nn.Module] = Registry("norm", nn.Module)
# A kernel backend (null picks by device); checked by the kernels' own rule.
KernelBackend = Annotated[str | None, lambda value, option: check_backend(value)]


def register_norm(name: str) -> Callable[[type], type]:
    """Decorator registering a norm (an ``nn.Module`` built as ``cls(dim, ...)``) under ``name``."""
    return NORM_REGISTRY.register(name)


class _Norm(Configurable):
    """Shared plumbing: the input width check (``from_config`` comes from :class:`Configurable`)."""

    dim: int
    backend: str | None
    weight: nn.Parameter

    def check_input(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.dim:
            raise ValueError(f"last dimension must be dim={self.dim}, got shape {tuple(x.shape)}")

    def _runs_twin_as_is(self, x: torch.Tensor) -> bool:
        """Whether the kernel call would run its torch twin on a float32/float64 input of the weight's
        dtype: the twin then computes torch's own norm in that dtype, with nothing cast, so the module
        calls it directly. This spares a small model's CPU step the kernel layer's host cost (its
        checks of arguments this module owns, and the no-op casts), about 9 µs per call."""
        return (
            x.dtype in (torch.float32, torch.float64)
            and self.weight.dtype == x.dtype
            and not self._kernel_runs_triton(x)
        )

    def _kernel_runs_triton(self, x: torch.Tensor) -> bool:
        return kernels.use_triton(self.backend, x)


@register_norm("layernorm")
class LayerNorm(_Norm):
    """LayerNorm over the last dimension via :func:`brickwork.kernels.layer_norm`; x ``[..., dim]``.

    Parameters ``weight`` ``[dim]`` (ones) and, with ``bias``, ``bias`` ``[dim]`` (zeros). ``backend``
    (None | "torch" | "triton") is passed to the kernel; None picks Triton for CUDA tensors. Where the
    kernel would run its twin on a float32/float64 input, torch's ``layer_norm`` runs directly (the same
    computation).
    """

    def __init__(
        self, dim: PositiveInt, eps: PositiveFloat = 1e-5, bias: Flag = True, backend: KernelBackend = None
    ) -> None:
        super().__init__()
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
        if self._runs_twin_as_is(x):
            return F.layer_norm(x, (self.dim,), self.weight, self.bias, self.eps)
        return kernels.layer_norm(x, self.weight, self.bias, self.eps, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, bias={self.bias is not None}"


@register_norm("rmsnorm")
class RMSNorm(_Norm):
    """RMSNorm (Zhang & Sennrich 2019) over the last dimension via :func:`brickwork.kernels.rms_norm`:
    ``x / sqrt(mean(x²) + eps) * weight``; x ``[..., dim]``, parameter ``weight`` ``[dim]`` (ones).
    ``backend`` None runs torch's own norm on every device, ``"triton"`` the fused kernel
    (:func:`brickwork.kernels.backend.rms_norm_uses_triton` says why)."""

    def __init__(self, dim: PositiveInt, eps: PositiveFloat = 1e-6, backend: KernelBackend = None) -> None:
        super().__init__()
        self.dim, self.eps, self.backend = dim, float(eps), backend
        self.weight = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)

    def _kernel_runs_triton(self, x: torch.Tensor) -> bool:
        return kernels.rms_norm_uses_triton(self.backend, x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        if self._runs_twin_as_is(x):
            return F.rms_norm(x, (self.dim,), self.weight, self.eps)
        return kernels.rms_norm(x, self.weight, self.eps, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"
