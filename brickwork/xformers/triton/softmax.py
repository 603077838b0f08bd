"""xformers' ``softmax`` / ``log_softmax`` with an additive mask and a causal flag.

``softmax`` runs ``brickwork.kernels.masked_softmax`` (Triton on CUDA); a row with nothing left to
attend to gives zeros there, where a plain softmax gives NaN. ``log_softmax`` has no kernel: it runs
as torch ops on the same masked scores."""

from __future__ import annotations

import torch

from brickwork import kernels
from brickwork.components.attention.masks import causal_keep


def softmax(x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
    """softmax(x + mask) over the last dimension; ``causal`` also hides key j > query i."""
    if mask is not None and mask.is_floating_point():
        mask = mask.to(x.dtype)
    return kernels.masked_softmax(x, mask, causal=causal)


def log_softmax(x: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
    """log softmax(x + mask) over the last dimension (-inf where masked)."""
    scores = x if mask is None else x + mask.to(x.dtype)
    if causal:
        scores = scores.masked_fill(~causal_keep(x.shape[-2], x.shape[-1], x.device), float("-inf"))
    return torch.log_softmax(scores, dim=-1)
