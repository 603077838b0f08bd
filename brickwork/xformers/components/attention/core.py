"""xformers' functional attention on ``[N, T, D]`` tensors, with its mask types, on brickwork's softmax."""

from __future__ import annotations

import math

import torch
from torch import nn

from brickwork.kernels import masked_softmax
from brickwork.xformers.components.attention._sputnik_sparse import SparseCS
from brickwork.xformers.components.attention.attention_mask import AttentionMask

MaskLike = AttentionMask | SparseCS | torch.Tensor


def dense_mask(att_mask: MaskLike | None) -> torch.Tensor | None:
    """Any xformers mask as a dense tensor: boolean (True = attend) or additive float.

    A sparse pattern attends exactly where it stores entries; a sparse float mask is additive."""
    if att_mask is None:
        return None
    if isinstance(att_mask, AttentionMask):
        return att_mask.values
    if isinstance(att_mask, SparseCS) or att_mask.layout != torch.strided:
        return att_mask.to_dense()
    return att_mask


def fit_mask(mask: torch.Tensor, batch: int, tq: int, tk: int) -> torch.Tensor:
    """``mask`` cropped to ``[.., tq, tk]`` (xformers crops a longer mask to the sequence) and its batch
    repeated when it divides the batch of the scores (one mask per sample, shared by the heads)."""
    mask = mask[..., :tq, :tk]
    if mask.ndim == 3 and mask.shape[0] not in (1, batch) and batch % mask.shape[0] == 0:
        mask = mask.repeat(batch // mask.shape[0], 1, 1)
    return mask


def scaled_query_key_softmax(q: torch.Tensor, k: torch.Tensor, att_mask: MaskLike | None) -> torch.Tensor:
    """softmax(q kᵀ / √D + mask) over the keys: ``[N, Tq, Tk]``. A row with no key left is all zeros."""
    mask = dense_mask(att_mask)
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        mask = fit_mask(mask, scores.shape[0], scores.shape[-2], scores.shape[-1])
        if mask.is_floating_point():
            mask = mask.to(scores.dtype)
    return masked_softmax(scores, mask, scale=1.0 / math.sqrt(k.shape[-1]))


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    att_mask: MaskLike | None,
    dropout: nn.Module | None = None,
    block_size: int = 128,
) -> torch.Tensor:
    """q ``[N, Tq, D]`` (or ``[B, H, Tq, D]``), k/v ``[N, Tk, D]`` -> ``[N, Tq, D]``.

    ``block_size`` is accepted for xformers' Triton block-sparse switch, which brickwork does not make."""
    sparse = isinstance(att_mask, SparseCS) or (
        isinstance(att_mask, torch.Tensor) and att_mask.layout != torch.strided
    )
    if sparse:
        # xformers ran sparse masks in fp32, outside autocast.
        with torch.autocast(q.device.type, enabled=False):
            return _attend(q.float(), k.float(), v.float(), att_mask, dropout)
    return _attend(q, k, v, att_mask, dropout)


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, att_mask: MaskLike | None, dropout: nn.Module | None
) -> torch.Tensor:
    probs = scaled_query_key_softmax(q, k, att_mask)
    if dropout is not None:
        probs = dropout(probs)
    return probs.to(v.dtype) @ v
