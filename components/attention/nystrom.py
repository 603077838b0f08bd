"""Nyström attention: softmax attention approximated through ``num_landmarks`` segment-mean landmarks.

Xiong et al., "Nyströmformer: A Nyström-Based Algorithm for Approximating Self-Attention" (2021),
https://arxiv.org/abs/2102.03902
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from brickwork.checks import Flag, PositiveInt, Probability
from brickwork.components.attention.base import AttentionMechanism, register_attention
from brickwork.components.attention.masks import key_padding_keep
from brickwork.components.attention.scaled_dot_product import dense_attention
from brickwork.kernels import masked_softmax


def segment_means(x: torch.Tensor, num_segments: int, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Means of x ``[B, H, T, D]`` over ``num_segments`` contiguous segments -> ``[B, H, num_segments, D]``.

    Segments follow ``adaptive_avg_pool1d``. ``keep`` ``[B|1, H|1, T, 1]`` drops masked rows from the
    means; a segment with no kept row gives a zero landmark.
    """
    t = x.shape[-2]
    seg = torch.arange(num_segments, device=x.device)
    start, end = (seg * t) // num_segments, -((-(seg + 1) * t) // num_segments)
    pos = torch.arange(t, device=x.device)
    member = ((pos >= start[:, None]) & (pos < end[:, None])).to(x.dtype)  # (S, T)
    if keep is not None:
        member = member * keep.to(x.dtype).transpose(-2, -1)  # (B, H, S, T)
    return (member @ x) / member.sum(dim=-1, keepdim=True).clamp_min(1.0)


def iterative_pinv(matrix: torch.Tensor, iterations: int, original_init: bool = False) -> torch.Tensor:
    """Moore-Penrose pseudo-inverse of ``[..., m, m]`` by the iteration of Razavi et al. (2014).

    The start ``Z0 = Kᵀ / (‖K‖₁ ‖K‖∞)`` guarantees convergence; ``original_init`` uses the paper code's
    batch-wide, more conservative coefficient instead of the per-matrix one.
    """
    identity = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    col_sums = matrix.abs().sum(dim=-2).amax(dim=-1)
    row_sums = matrix.abs().sum(dim=-1).amax(dim=-1)
    if original_init:
        z = matrix.transpose(-2, -1) / (col_sums.amax() * row_sums.amax())
    else:
        z = matrix.transpose(-2, -1) / (col_sums * row_sums)[..., None, None]
    for _ in range(iterations):
        kz = matrix @ z
        z = 0.25 * z @ (13 * identity - kz @ (15 * identity - kz @ (7 * identity - kz)))
    return z


@register_attention("nystrom")
class NystromAttention(AttentionMechanism):
    """softmax(q k̃ᵀ) pinv(softmax(q̃ k̃ᵀ)) softmax(q̃ kᵀ) v, with q̃, k̃ the segment means of q and k.

    When q or k has no more rows than ``num_landmarks`` the exact attention is computed instead. A
    key-padding mask removes the masked keys from k̃ and from the last softmax and, for self-attention
    (Tq == Tk), the same positions from q̃, so padded tokens cannot reach any output.

    ``causal``: landmark j stands at the last position of its segment. Query i uses only the landmarks
    at or before i, each landmark sees only keys up to its own position, and the landmark kernel is
    lower triangular, so its exact inverse (a triangular solve, in place of the pseudo-inverse
    iteration, whose start mixes all landmarks) is lower triangular too. Queries before the first
    landmark attend exactly over their few keys. Lengths that differ (Tq != Tk, a cached decode step)
    use exact causal attention.
    """

    causal_safe = True
    mask_support = "key_padding"

    def __init__(
        self,
        num_landmarks: PositiveInt = 64,
        causal: Flag = False,
        inv_iterations: PositiveInt = 6,
        use_razavi_pinverse: Flag = True,
        pinverse_original_init: Flag = False,
        dropout: Probability = 0.0,
    ) -> None:
        super().__init__()
        self.num_landmarks, self.causal, self.dropout = num_landmarks, causal, dropout
        self.inv_iterations, self.use_razavi_pinverse = inv_iterations, use_razavi_pinverse
        self.pinverse_original_init = pinverse_original_init

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """q ``[B, H, Tq, D]``, k/v ``[B, H, Tk, D]`` -> ``[B, H, Tq, D]``."""
        self.check_inputs(q, k, v, attn_mask)
        m = self.num_landmarks
        tq, tk = q.shape[-2], k.shape[-2]
        if tq <= m or tk <= m or (self.causal and tq != tk):
            out = dense_attention(q, k, v, attn_mask, causal=self.causal)
        else:
            out = self._approximate(q, k, v, attn_mask).to(v.dtype)
        return F.dropout(out, self.dropout, self.training)

    def _approximate(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None
    ) -> torch.Tensor:
        # The pseudo-inverse iteration is unstable in half precision.
        dtype = torch.promote_types(q.dtype, torch.float32)
        q, k, v = q.to(dtype) * q.shape[-1] ** -0.5, k.to(dtype), v.to(dtype)
        m = self.num_landmarks
        keep = None if attn_mask is None else key_padding_keep(attn_mask)  # (B|1, H|1, Tk, 1)
        q_land = segment_means(q, m, keep if q.shape[-2] == k.shape[-2] else None)
        k_land = segment_means(k, m, keep)
        land_mask = key_mask = None
        if keep is not None:
            # A landmark whose segment is all padding carries nothing: mask it out as a key.
            land_mask = segment_means(keep.to(dtype), m).transpose(-2, -1) > 0  # (B|1, H|1, 1, m)
            key_mask = keep.transpose(-2, -1)
        if self.causal:
            return self._causal(q, k, v, q_land, k_land, land_mask, key_mask)
        kernel_1 = masked_softmax(q @ k_land.transpose(-2, -1), land_mask)  # (B, H, Tq, m)
        kernel_2 = masked_softmax(q_land @ k_land.transpose(-2, -1), land_mask)  # (B, H, m, m)
        kernel_3 = masked_softmax(q_land @ k.transpose(-2, -1), key_mask)  # (B, H, m, Tk)
        if self.use_razavi_pinverse:
            inverse = iterative_pinv(kernel_2, self.inv_iterations, self.pinverse_original_init)
        else:
            inverse = torch.linalg.pinv(kernel_2)
        return kernel_1 @ (inverse @ (kernel_3 @ v))

    def _causal(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_land: torch.Tensor,
        k_land: torch.Tensor,
        land_mask: torch.Tensor | None,
        key_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        t, m = q.shape[-2], q_land.shape[-2]
        seg = torch.arange(m, device=q.device)
        last = -((-(seg + 1) * t) // m) - 1  # the position of each landmark: its segment's last row
        pos = torch.arange(t, device=q.device)
        sees_landmark = last[None, :] <= pos[:, None]  # (T, m)
        landmark_order = seg[None, :] <= seg[:, None]  # (m, m)
        landmark_sees = pos[None, :] <= last[:, None]  # (m, T)
        if land_mask is not None:
            sees_landmark, landmark_order = sees_landmark & land_mask, landmark_order & land_mask
        if key_mask is not None:
            landmark_sees = landmark_sees & key_mask
        kernel_1 = masked_softmax(q @ k_land.transpose(-2, -1), sees_landmark)  # (B, H, T, m)
        kernel_2 = masked_softmax(q_land @ k_land.transpose(-2, -1), landmark_order)  # (B, H, m, m)
        kernel_3 = masked_softmax(q_land @ k.transpose(-2, -1), landmark_sees)  # (B, H, m, T)
        if land_mask is not None:
            # An empty landmark (all padding) has a zero diagonal; a unit one keeps the solve regular,
            # and its zero column here and in kernel_1 keeps it out of every output.
            kernel_2 = kernel_2 + torch.diag_embed((~land_mask[..., 0, :]).to(kernel_2.dtype))
        mixed = torch.linalg.solve_triangular(kernel_2, kernel_3 @ v, upper=False)  # (B, H, m, D)
        out = kernel_1 @ mixed
        # Rows before the first landmark: exact causal attention over the keys they may see.
        head = int(last[0])
        if head > 0:
            mask = None if key_mask is None else key_mask[..., :head]
            # q was pre-scaled above, so the exact rows use scale 1.
            first = (t[..., :head, :] for t in (q, k, v))
            exact = dense_attention(*first, mask, causal=True, scale=1.0)
            out = torch.cat([exact, out[..., head:, :]], dim=-2)
        return out
