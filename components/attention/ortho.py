"""Orthoformer: attention through ``num_landmarks`` keys chosen to be as mutually orthogonal as possible.

Patrick et al., "Keeping Your Eye on the Ball: Trajectory Attention in Video Transformers" (2021),
https://arxiv.org/abs/2106.05392
"""

from __future__ import annotations

from typing import Annotated, Any

import torch
import torch.nn.functional as F

from brickwork.checks import OneOf, PositiveFloat, PositiveInt, Probability
from brickwork.components.attention.base import AttentionMechanism, register_attention
from brickwork.components.attention.masks import key_padding_keep
from brickwork.errors import ConfigError
from brickwork.kernels import masked_softmax


def orthogonal_landmarks(
    k: torch.Tensor, num_landmarks: int, keep: torch.Tensor | None = None
) -> torch.Tensor:
    """Indices ``[B, H, m]`` of ``m`` keys picked greedily: first the longest key, then each time the key
    whose largest |cosine| to those picked is smallest. Masked keys (``keep`` False) are never picked
    while an unmasked one is left."""
    unit = F.normalize(k.detach().float(), dim=-1)
    blocked = torch.zeros(k.shape[:-1], dtype=torch.bool, device=k.device)
    if keep is not None:
        blocked = blocked | ~keep[..., 0].expand_as(blocked)
    norms = k.detach().float().norm(dim=-1).masked_fill(blocked, -1.0)
    picked = [norms.argmax(dim=-1)]
    overlap = torch.zeros(k.shape[:-1], device=k.device)
    for _ in range(num_landmarks - 1):
        last = unit.gather(-2, picked[-1][..., None, None].expand(*unit.shape[:-2], 1, unit.shape[-1]))
        overlap = torch.maximum(overlap, (unit @ last.transpose(-2, -1)).squeeze(-1).abs())
        index = torch.stack(picked, dim=-1)
        # A tensor source (not the scalar overload) so that torch.jit.trace can record it.
        taken = torch.zeros_like(blocked).scatter(-1, index, torch.ones_like(index, dtype=torch.bool))
        picked.append(overlap.masked_fill(taken | blocked, 2.0).argmin(dim=-1))
    return torch.stack(picked, dim=-1)


LANDMARK_SELECTIONS = ("orthogonal", "kmeans", "kmeans_spherical", "random")
KMEANS_ITERATIONS = 6


def kmeans_landmarks(
    k: torch.Tensor, seeds: torch.Tensor, keep: torch.Tensor | None = None, spherical: bool = False
) -> torch.Tensor:
    """``[B, H, m, D]`` centroids of the keys after Lloyd iterations started at ``seeds`` ``[B, H, m, D]``.

    Masked keys (``keep`` False) take no part. ``spherical`` clusters key directions (cosine
    similarity) and gives each centroid the mean norm of its keys, so landmarks keep the keys' scale."""
    points = k.detach().float()
    weight = (
        torch.ones(points.shape[:-1], device=k.device)
        if keep is None
        else keep[..., 0].expand(points.shape[:-1]).float()
    )
    if spherical:
        norms = points.norm(dim=-1)
        points = F.normalize(points, dim=-1)
    centroids = seeds.detach().float()
    for _ in range(KMEANS_ITERATIONS):
        if spherical:
            nearest = (points @ F.normalize(centroids, dim=-1).transpose(-2, -1)).argmax(dim=-1)  # (B, H, T)
        else:
            nearest = torch.cdist(points, centroids).argmin(dim=-1)
        assign = F.one_hot(nearest, centroids.shape[-2]).float() * weight[..., None]  # (B, H, T, m)
        count = assign.sum(dim=-2)[..., None]  # (B, H, m, 1)
        means = assign.transpose(-2, -1) @ points / count.clamp_min(1.0)
        # A centroid that lost all its keys stays where it was rather than collapsing to zero.
        centroids = torch.where(count > 0, means, centroids)
    if spherical:
        scale = (assign * norms[..., None]).sum(dim=-2)[..., None] / count.clamp_min(1.0)
        centroids = F.normalize(centroids, dim=-1) * torch.where(
            count > 0, scale, seeds.detach().float().norm(dim=-1, keepdim=True)
        )
    return centroids.to(k.dtype)


def random_landmarks(k: torch.Tensor, num_landmarks: int, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Indices ``[B, H, m]`` of ``m`` distinct keys drawn uniformly (from the global RNG), unmasked first."""
    scores = torch.rand(k.shape[:-1], device=k.device)
    if keep is not None:
        scores = scores.masked_fill(~keep[..., 0].expand_as(scores), -1.0)
    return scores.topk(num_landmarks, dim=-1).indices


@register_attention("ortho")
class OrthoformerAttention(AttentionMechanism):
    """softmax(q Lᵀ / √D) softmax(L kᵀ / √D) v, with L the ``num_landmarks`` most orthogonal keys.

    ``landmark_selection``: ``"orthogonal"`` (default), ``"random"`` keys, or k-means centroids of the
    keys, ``"kmeans"`` (Euclidean) or ``"kmeans_spherical"`` (by direction), seeded by the orthogonal
    picks. Landmarks are picked among the first ``subsample_fraction`` of the keys' positions spread evenly
    (all keys at 1.0). Sequences with no more keys than landmarks use exact attention. A key-padding
    mask keeps padded keys out of the landmarks and out of the second softmax. Each query mixes
    landmarks taken from the whole sequence, so there is no causal form.
    """

    causal_safe = False
    mask_support = "key_padding"

    def __init__(
        self,
        num_landmarks: PositiveInt = 32,
        subsample_fraction: PositiveFloat = 1.0,
        dropout: Probability = 0.0,
        landmark_selection: Annotated[str, OneOf(LANDMARK_SELECTIONS)] = "orthogonal",
    ) -> None:
        super().__init__()
        self.num_landmarks, self.subsample_fraction, self.dropout = num_landmarks, subsample_fraction, dropout
        self.landmark_selection = landmark_selection

    @staticmethod
    def check_options(options: Any) -> None:
        if options.subsample_fraction > 1:
            raise ConfigError(f"must be in (0, 1], got {options.subsample_fraction!r}", "subsample_fraction")

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """q ``[B, H, Tq, D]``, k/v ``[B, H, Tk, D]`` -> ``[B, H, Tq, D]``."""
        self.check_inputs(q, k, v, attn_mask)
        keep = None if attn_mask is None else key_padding_keep(attn_mask)  # (B|1, H|1, Tk, 1)
        key_mask = None if keep is None else keep.transpose(-2, -1)
        scale = q.shape[-1] ** -0.5
        m, tk = self.num_landmarks, k.shape[-2]
        if tk <= m:
            probs = masked_softmax(q @ k.transpose(-2, -1), key_mask, scale=scale)
            return F.dropout(probs, self.dropout, self.training) @ v
        pool = k
        if self.subsample_fraction < 1.0:
            count = max(m, int(tk * self.subsample_fraction))
            rows = torch.linspace(0, tk - 1, count, device=k.device).round().long()
            pool = k[..., rows, :]
            keep = None if keep is None else keep.expand(*k.shape[:2], tk, 1)[..., rows, :]
        landmarks = self.select_landmarks(pool, keep)  # (B, H, m, D)
        to_landmarks = masked_softmax(q @ landmarks.transpose(-2, -1), scale=scale)  # (B, H, Tq, m)
        from_keys = masked_softmax(landmarks @ k.transpose(-2, -1), key_mask, scale=scale)  # (B, H, m, Tk)
        return F.dropout(to_landmarks, self.dropout, self.training) @ (from_keys @ v)

    def select_landmarks(self, pool: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        """``[B, H, m, D]`` landmarks from the candidate keys ``pool`` ``[B, H, T, D]``, as
        ``landmark_selection`` says: the most orthogonal keys, random keys, or k-means centroids
        (Euclidean or spherical) grown from the orthogonal picks."""
        pick = random_landmarks if self.landmark_selection == "random" else orthogonal_landmarks
        index = pick(pool, self.num_landmarks, keep)  # (B, H, m)
        picked = pool.gather(-2, index[..., None].expand(*index.shape, pool.shape[-1]))
        if self.landmark_selection.startswith("kmeans"):
            return kmeans_landmarks(
                pool, picked, keep, spherical=self.landmark_selection == "kmeans_spherical"
            )
        return picked
