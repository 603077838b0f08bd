"""Float64 softmax attention written out step by step: the oracle for the attention tests."""

from __future__ import annotations

import torch


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """softmax(q kᵀ · scale + mask) v in float64; [B, H, Tq, D] -> [B, H, Tq, D].

    Boolean masks keep True entries, float masks are added. ``causal`` and ``window`` (|i - j| <= window)
    place query i at position i + Tk - Tq. Rows with nothing to attend to are zeros. k/v with fewer heads
    than q serve groups of consecutive query heads.
    """
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    tq, tk = scores.shape[-2:]
    allowed = torch.ones_like(scores, dtype=torch.bool)
    if mask is not None:
        if mask.dtype == torch.bool:
            allowed = allowed & mask
        else:
            scores = scores + mask.double()
    for i in range(tq):
        pos = i + tk - tq
        for j in range(tk):
            if (causal and j > pos) or (window is not None and abs(pos - j) > window):
                allowed[..., i, j] = False
    allowed = allowed & (scores > float("-inf"))
    scores = scores.masked_fill(~allowed, float("-inf"))
    top = scores.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weights = torch.exp(scores - top)
    total = weights.sum(dim=-1, keepdim=True)
    probs = torch.where(total > 0, weights / total.clamp_min(1e-300), torch.zeros_like(weights))
    return probs @ v
