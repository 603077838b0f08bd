"""Checks on model inputs, so a wrong shape or dtype fails with its value named, not deep inside."""

from __future__ import annotations

import torch


def check_token_ids(name: str, ids: torch.Tensor, max_seq_len: int | None = None) -> None:
    """``ids`` must be an integer tensor [B, T] with T <= ``max_seq_len`` when that is set."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids [B, T], got {type(ids).__name__}")
    if ids.dim() != 2:
        raise ValueError(f"{name} must have shape [B, T], got shape {tuple(ids.shape)}")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got dtype {ids.dtype}")
    if max_seq_len is not None and ids.shape[1] > max_seq_len:
        raise ValueError(f"{name} has sequence length {ids.shape[1]}, longer than max_seq_len={max_seq_len}")


def padding_mask(name: str, mask: torch.Tensor | None, shape: tuple[int, int]) -> torch.Tensor | None:
    """A [B, T] mask with 1 = real token, 0 = padding -> boolean [B, 1, 1, T] (True = may attend).

    ``shape`` is the (B, T) the mask must have: the keys it masks.
    """
    if mask is None:
        return None
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have the shape of the ids {tuple(shape)}, got {tuple(mask.shape)}")
    return mask.to(torch.bool)[:, None, None, :]
