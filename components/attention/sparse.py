"""Softmax attention restricted to a fixed sparsity pattern, on FlexAttention block masks or a dense mask.

A pattern is one function ``keep(q_pos, k_pos) -> bool`` over broadcastable int32 position tensors. The
same function is FlexAttention's ``mask_mod`` (whose block mask lets the kernel skip whole blocks
outside the pattern) and, evaluated on a grid, the dense boolean mask SDPA takes. So both paths attend
to exactly the same keys.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from brickwork.checks import Flag, OneOf, Probability
from brickwork.components.attention.base import AttentionMechanism
from brickwork.components.attention.flex import flex_attention_for
from brickwork.components.attention.masks import restrict
from brickwork.components.attention.scaled_dot_product import dense_attention

BACKENDS = ("auto", "flex", "masked")
MAX_CACHED_MASKS = 8
Backend = Annotated[str, OneOf(BACKENDS)]


class PatternAttention(AttentionMechanism):
    """Base of the sparse patterns (``local``, ``random``, ``global``, ``blocksparse``).

    Subclasses define :meth:`keep`. Query i sits at position ``i + Tk - Tq`` (bottom-right, as a
    cached decode step); ``causal`` also drops keys after it. ``backend``: ``"masked"`` runs SDPA with
    the pattern as a dense mask (exact, everywhere, trainable); ``"flex"`` runs FlexAttention with a
    block mask; ``"auto"`` (default) uses FlexAttention on CUDA for full sequences (Tq == Tk) without
    ``attn_mask`` or dropout, the masked path otherwise. FlexAttention has no backward on CPU, so
    ``"flex"`` on CPU is inference only. A query row left with no key returns zeros on both paths.
    """

    causal_safe = True
    mask_support = "full"
    supports_gqa = True

    def __init__(self, causal: Flag = False, dropout: Probability = 0.0, backend: Backend = "auto") -> None:
        super().__init__()
        self.causal, self.dropout, self.backend = causal, dropout, backend
        # Patterns are fixed at construction, so their masks are built once per shape and device.
        self._masks: dict[tuple[str, int, int, str], torch.Tensor | BlockMask] = {}

    def keep(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Boolean: may the query at ``q_pos`` see the key at ``k_pos`` (before causality)?"""
        raise NotImplementedError

    def mask_mod(self, shift: int) -> Callable[..., torch.Tensor]:
        """The pattern as a FlexAttention ``mask_mod(b, h, q_idx, kv_idx)`` for query offset ``shift``."""
        causal = self.causal

        def mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
            pos = q_idx + shift
            allowed = self.keep(pos, kv_idx)
            return allowed & (kv_idx <= pos) if causal else allowed

        return mod

    def dense_keep(self, tq: int, tk: int, device: torch.device | str) -> torch.Tensor:
        """The pattern as a boolean ``[tq, tk]`` mask (True = may attend)."""
        return self._cached("dense", tq, tk, device, self._dense)

    def _dense(self, tq: int, tk: int, device: torch.device | str) -> torch.Tensor:
        q_idx = torch.arange(tq, device=device, dtype=torch.int32)[:, None]
        kv_idx = torch.arange(tk, device=device, dtype=torch.int32)[None, :]
        return self.mask_mod(tk - tq)(None, None, q_idx, kv_idx).expand(tq, tk)

    def block_mask(self, tq: int, tk: int, device: torch.device | str) -> BlockMask:
        """The pattern as a FlexAttention block mask."""
        return self._cached("flex", tq, tk, device, self._block)

    def _block(self, tq: int, tk: int, device: torch.device | str) -> BlockMask:
        return create_block_mask(self.mask_mod(tk - tq), None, None, tq, tk, device=device)

    def _cached(self, kind: str, tq: int, tk: int, device: torch.device | str, make: Callable) -> object:
        key = (kind, tq, tk, str(device))
        if key not in self._masks:
            self._masks[key] = make(tq, tk, device)
            while len(self._masks) > MAX_CACHED_MASKS:
                self._masks.pop(next(iter(self._masks)))
        return self._masks[key]

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """q ``[B, H, Tq, D]``, k/v ``[B, Hkv, Tk, D]`` -> ``[B, H, Tq, D]``."""
        self.check_inputs(q, k, v, attn_mask)
        dropout_p = self.dropout if self.training else 0.0
        tq, tk = q.shape[-2], k.shape[-2]
        backend = self.backend
        if backend == "auto":
            # Decode steps (Tq != Tk) change shape every call; the dense mask is cheap there.
            sparse_pays = q.is_cuda and tq == tk
            backend = "flex" if sparse_pays and attn_mask is None and dropout_p == 0.0 else "masked"
        if backend == "flex":
            if attn_mask is not None or dropout_p > 0.0:
                raise ValueError(
                    f"{type(self).__name__} backend='flex' takes no attn_mask and no training dropout; "
                    "use backend='auto' or 'masked'"
                )
            mask = self.block_mask(tq, tk, q.device)
            return flex_attention_for(q)(q, k, v, block_mask=mask, enable_gqa=k.shape[1] != q.shape[1])
        keep = self.dense_keep(tq, tk, q.device)
        return dense_attention(q, k, v, restrict(attn_mask, keep, q.dtype), dropout_p=dropout_p)
