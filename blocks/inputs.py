"""Checks on model inputs, so a wrong shape or dtype fails with its value named, not deep inside."""

from __future__ import annotations

import torch


def check_token_ids(
    name: str, ids: torch.Tensor, max_seq_len: int | None = None, vocab_size: int | None = None
) -> None:
    """``ids`` must be an integer tensor [B, T] with T <= ``max_seq_len`` when that is set, and ids in
    [0, ``vocab_size``) when that is set (checked on CPU tensors; see :func:`_checks_values`)."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids [B, T], got {type(ids).__name__}")
    if ids.dim() != 2:
        raise ValueError(f"{name} must have shape [B, T], got shape {tuple(ids.shape)}")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids, got dtype {ids.dtype}")
    if max_seq_len is not None and ids.shape[1] > max_seq_len:
        raise ValueError(f"{name} has sequence length {ids.shape[1]}, longer than max_seq_len={max_seq_len}")
    if vocab_size is not None and ids.numel() and _checks_values(ids):
        low, high = ids.min().item(), ids.max().item()
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"{name} holds the id {bad}, outside the vocabulary [0, {vocab_size})")


def check_positions(
    name: str, positions: torch.Tensor, shape: tuple[int, int], max_seq_len: int | None = None
) -> None:
    """``positions`` must be integers [B, T] (or [1, T]) for ids of ``shape`` (B, T), in
    [0, ``max_seq_len``) when that is set (values checked on CPU tensors, as ids are)."""
    if not isinstance(positions, torch.Tensor) or positions.dtype.is_floating_point:
        raise TypeError(f"{name} must be an integer tensor [B, T], got {positions!r}")
    b, t = shape
    if positions.dim() != 2 or positions.shape[1] != t or positions.shape[0] not in (1, b):
        raise ValueError(f"{name} must have shape [{b}, {t}] (or [1, {t}]), got {tuple(positions.shape)}")
    if positions.numel() and _checks_values(positions):
        low, high = positions.min().item(), positions.max().item()
        if low < 0 or (max_seq_len is not None and high >= max_seq_len):
            limit = "" if max_seq_len is None else f", below max_seq_len={max_seq_len}"
            bad = low if low < 0 else high
            raise ValueError(f"{name} holds the position {bad}; positions must be >= 0{limit}")


def _checks_values(tensor: torch.Tensor) -> bool:
    """Whether an input's values are checked, not only its shape: on CPU tensors, outside compilation.
    On a GPU the check would stall the host on every forward until the device caught up."""
    return tensor.device.type == "cpu" and not torch.compiler.is_compiling()


def padding_mask(name: str, mask: torch.Tensor | None, shape: tuple[int, int]) -> torch.Tensor | None:
    """A [B, T] mask with 1 = real token, 0 = padding -> boolean [B, 1, 1, T] (True = may attend).

    ``shape`` is the (B, T) the mask must have: the keys it masks.
    """
    if mask is None:
        return None
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have the shape of the ids {tuple(shape)}, got {tuple(mask.shape)}")
    if mask.dtype != torch.bool and mask.numel() and _checks_values(mask):
        other = mask[(mask != 0) & (mask != 1)]
        if other.numel():
            raise ValueError(f"{name} must hold 1 (real token) and 0 (padding), got {other[0].item()}")
    return mask.to(torch.bool)[:, None, None, :]
