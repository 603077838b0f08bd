"""Fused kernels with pure-torch twins. ``backend=None`` picks Triton for CUDA tensors, torch elsewhere."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _torch_only(backend: str | None) -> None:
    if backend not in (None, "torch"):
        raise NotImplementedError(f"backend {backend!r} is not available yet")


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float = 1e-5,
    backend: str | None = None,
) -> torch.Tensor:
    """LayerNorm over the last dimension. x: [..., N]; weight, bias: [N]."""
    _torch_only(backend)
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, backend: str | None = None
) -> torch.Tensor:
    """RMSNorm over the last dimension. x: [..., N]; weight: [N]."""
    _torch_only(backend)
    return F.rms_norm(x, x.shape[-1:], weight, eps)


def bias_gelu(
    x: torch.Tensor, bias: torch.Tensor | None, approximate: str = "none", backend: str | None = None
) -> torch.Tensor:
    """gelu(x + bias). x: [..., N]; bias: [N]."""
    _torch_only(backend)
    return F.gelu(x if bias is None else x + bias, approximate=approximate)


def masked_softmax(
    scores: torch.Tensor, mask: torch.Tensor | None = None, scale: float = 1.0, causal: bool = False,
    backend: str | None = None,
) -> torch.Tensor:
    """softmax(scores * scale + mask) over the last dim; fully masked rows give zeros."""
    _torch_only(backend)
    s = scores.float() * scale
    tq, tk = s.shape[-2], s.shape[-1]
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.float()
    if causal:
        keep = torch.ones(tq, tk, dtype=torch.bool, device=s.device).tril(tk - tq)
        s = s.masked_fill(~keep, float("-inf"))
    y = torch.softmax(s, dim=-1)
    return torch.nan_to_num(y, nan=0.0).to(scores.dtype)
