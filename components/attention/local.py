"""Sliding-window attention: each query sees the keys within ``window_size // 2`` positions of it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from brickwork.checks import Flag, OneOf, PositiveInt, Probability
from brickwork.components.attention.base import AttentionMechanism, register_attention
from brickwork.components.attention.masks import restrict
from brickwork.components.attention.scaled_dot_product import dense_attention

BACKENDS = ("auto", "flex", "masked")
MAX_CACHED_BLOCK_MASKS = 8


def local_keep(
    tq: int, tk: int, window_size: int, causal: bool, device: torch.device | str | None = None
) -> torch.Tensor:
    """Boolean ``[tq, tk]`` window pattern; query i sits at position ``i + tk - tq`` (bottom-right)."""
    pos_q = torch.arange(tq, device=device)[:, None] + (tk - tq)
    pos_k = torch.arange(tk, device=device)[None, :]
    keep = (pos_q - pos_k).abs() <= window_size // 2
    return keep & (pos_k <= pos_q) if causal else keep


@functools.cache
def _compiled_flex() -> Callable[..., torch.Tensor]:
    # Compiled once per process and only on first CUDA use: eager FlexAttention materializes the scores.
    return torch.compile(flex_attention, dynamic=False)


@register_attention("local")
class LocalAttention(AttentionMechanism):
    """Attention restricted to a sliding window of ``window_size`` positions centred on each query
    (only its past half when ``causal``), as in xformers' ``local`` attention.

    ``backend``: ``"masked"`` runs SDPA with the window as a dense mask (exact, everywhere);
    ``"flex"`` runs FlexAttention with a block-sparse mask that skips blocks outside the window;
    ``"auto"`` (default) uses FlexAttention on CUDA for full sequences (Tq == Tk) when no ``attn_mask``
    or dropout is in play, and the masked path otherwise. FlexAttention has no backward on CPU, so
    ``"flex"`` on CPU is inference only.
    """

    causal_safe = True
    mask_support = "full"
    supports_gqa = True

    def __init__(
        self,
        window_size: PositiveInt = 5,
        causal: Flag = False,
        dropout: Probability = 0.0,
        backend: Annotated[str, OneOf(BACKENDS)] = "auto",
    ) -> None:
        super().__init__()
        self.window_size, self.causal, self.dropout, self.backend = window_size, causal, dropout, backend
        self._block_masks: dict[tuple[int, int, str], BlockMask] = {}

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """q ``[B, H, Tq, D]``, k/v ``[B, Hkv, Tk, D]`` -> ``[B, H, Tq, D]``."""
        self.check_inputs(q, k, v, attn_mask)
        dropout_p = self.dropout if self.training else 0.0
        backend = self.backend
        if backend == "auto":
            # Decode steps (Tq != Tk) change shape every call; the dense mask is cheap there.
            sparse_pays = q.is_cuda and q.shape[-2] == k.shape[-2]
            backend = "flex" if sparse_pays and attn_mask is None and dropout_p == 0.0 else "masked"
        if backend == "flex":
            if attn_mask is not None or dropout_p > 0.0:
                raise ValueError(
                    "LocalAttention backend='flex' takes no attn_mask and no training dropout; "
                    "use backend='auto' or 'masked'"
                )
            return self._flex(q, k, v)
        tq, tk = q.shape[-2], k.shape[-2]
        keep = local_keep(tq, tk, self.window_size, self.causal, q.device)
        return dense_attention(q, k, v, restrict(attn_mask, keep, q.dtype), dropout_p=dropout_p)

    def _flex(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        tq, tk = q.shape[-2], k.shape[-2]
        key = (tq, tk, str(q.device))
        if key not in self._block_masks:
            self._block_masks[key] = self._block_mask(tq, tk, q.device)
            while len(self._block_masks) > MAX_CACHED_BLOCK_MASKS:
                self._block_masks.pop(next(iter(self._block_masks)))
        attend = _compiled_flex() if q.is_cuda else flex_attention
        # Rows with no visible key (only when Tq > Tk and causal) come back as zeros from FlexAttention.
        return attend(q, k, v, block_mask=self._block_masks[key], enable_gqa=k.shape[1] != q.shape[1])

    def _block_mask(self, tq: int, tk: int, device: torch.device) -> BlockMask:
        half, causal, shift = self.window_size // 2, self.causal, tk - tq

        def in_window(batch: torch.Tensor, head: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor):
            pos = q_idx + shift
            inside = (pos - kv_idx).abs() <= half
            return inside & (kv_idx <= pos) if causal else inside

        return create_block_mask(in_window, None, None, tq, tk, device=device)
