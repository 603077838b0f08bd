"""xformers' mask helpers: key-padding reshapes and mask merging (boolean False = masked out)."""

from __future__ import annotations

import torch

from brickwork.components.attention.masks import restrict
from brickwork.xformers._compat import require


def reshape_key_padding_mask(key_padding_mask: torch.Tensor, batched_dim: int) -> torch.Tensor:
    """``[B, Tk]`` -> ``[B*H, 1, Tk]`` for ``batched_dim = B*H``."""
    require(key_padding_mask.ndim == 2, f"a key padding mask is [B, Tk], got {tuple(key_padding_mask.shape)}")
    batch_size, src_len = key_padding_mask.shape
    num_heads = batched_dim // batch_size
    expanded = key_padding_mask.view(batch_size, 1, 1, src_len).expand(-1, num_heads, -1, -1)
    return expanded.reshape(batch_size * num_heads, 1, src_len)


def maybe_merge_masks(
    att_mask: torch.Tensor | None,
    key_padding_mask: torch.Tensor | None,
    batch_size: int,
    src_len: int,
    num_heads: int,
    tgt_len: int | None = None,
) -> torch.Tensor | None:
    """``att_mask`` combined with a ``[B, Tk]`` key padding mask into ``[B*H, Tq, Tk]``."""
    tgt_len = src_len if tgt_len is None else tgt_len
    if key_padding_mask is None:
        return att_mask
    require(
        tuple(key_padding_mask.shape) == (batch_size, src_len),
        f"key padding mask of shape {tuple(key_padding_mask.shape)}, expected {(batch_size, src_len)}",
    )
    padding = reshape_key_padding_mask(key_padding_mask, batch_size * num_heads)
    if att_mask is None:
        return padding.expand(-1, tgt_len, -1)
    return restrict(att_mask, padding, att_mask.dtype)


def bool_mask_to_additive(mask: torch.Tensor, dtype: torch.dtype | None = torch.float32) -> torch.Tensor:
    """0 where ``mask`` is True, -inf elsewhere."""
    require(mask.dtype == torch.bool, f"expected a boolean mask, got {mask.dtype}")
    return torch.zeros_like(mask, dtype=dtype).masked_fill(~mask, float("-inf"))
