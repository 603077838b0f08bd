"""Exact softmax attention, softmax(q kᵀ · scale + mask) v, on torch SDPA or on explicit scores."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right
from torch.nn.attention.flex_attention import BlockMask

from brickwork.checks import Flag, OneOf, PositiveFloat, Probability
from brickwork.components.attention.base import AttentionMechanism, register_attention
from brickwork.components.attention.flex import flex_attention_for
from brickwork.components.attention.masks import causal_keep, open_rows, restrict, rows_with_keys
from brickwork.kernels import masked_softmax

BACKENDS = ("sdpa", "math")


def dense_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> torch.Tensor:
    """Softmax attention through ``F.scaled_dot_product_attention``; q ``[B, H, Tq, D]`` -> ``[B, H, Tq, D]``.

    k/v may have fewer heads than q (grouped-query). ``causal`` is bottom-right aligned. A query row with
    no key left to attend to returns zeros, with zero (not NaN) gradients.
    """
    tq, tk = q.shape[-2], k.shape[-2]
    is_causal = False
    live = None
    plain_causal = causal and attn_mask is None
    if plain_causal and tq == tk:
        is_causal = True  # SDPA's is_causal is top-left aligned: the same as ours only when Tq == Tk.
    elif plain_causal and tq == 1:
        pass  # the one query is the newest position and sees every key: no mask at all
    elif plain_causal and tq < tk and q.is_cuda and not torch.compiler.is_compiling():
        # Fewer queries than keys (a chunk after a KV cache, a context-parallel slice): a bottom-right
        # CausalBias lets SDPA keep its flash kernel, which a materialised mask rules out. Eager CUDA
        # only: dynamo cannot build the bias inside a graph, and elsewhere SDPA would materialise it
        # anyway (warning that it did). No row is empty here, so there are no rows to reopen.
        attn_mask = causal_lower_right(tq, tk)
    else:
        if causal:
            attn_mask = restrict(attn_mask, causal_keep(tq, tk, q.device), q.dtype)
        if attn_mask is not None:
            if attn_mask.dtype != torch.bool:
                attn_mask = attn_mask.to(q.dtype)
            live = rows_with_keys(attn_mask)
            attn_mask = open_rows(attn_mask, live)
    out = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=attn_mask,
        dropout_p=dropout_p,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=int(k.shape[1]) != int(q.shape[1]),  # ints, also under torch.jit.trace
    )
    if live is not None:
        out = out.masked_fill(~live[..., None], 0.0)
    return out


def math_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> torch.Tensor:
    """As :func:`dense_attention`, through explicit scores and ``brickwork.kernels.masked_softmax``."""
    if k.shape[1] != q.shape[1]:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    probs = masked_softmax(q @ k.transpose(-2, -1), attn_mask, scale=scale, causal=causal)  # (B, H, Tq, Tk)
    if dropout_p > 0.0:
        probs = F.dropout(probs, dropout_p)
    return probs @ v


@register_attention("scaled_dot_product")
class ScaledDotProduct(AttentionMechanism):
    """Exact attention. ``backend="sdpa"`` uses torch's fused kernels; ``"math"`` materializes the scores
    and runs brickwork's masked softmax (a fused Triton kernel on CUDA).

    q ``[B, H, Tq, D]``, k/v ``[B, Hkv, Tk, D]`` with H a multiple of Hkv -> ``[B, H, Tq, D]``.
    """

    causal_safe = True
    mask_support = "full"
    supports_gqa = True
    context_parallel_safe = True

    def __init__(
        self,
        dropout: Probability = 0.0,
        causal: Flag = False,
        backend: Annotated[str, OneOf(BACKENDS)] = "sdpa",
        scale: PositiveFloat | None = None,
    ) -> None:
        """``scale`` defaults to 1/sqrt(D)."""
        super().__init__()
        self.causal, self.backend = causal, backend
        self._attend = dense_attention if backend == "sdpa" else math_attention
        self.dropout, self.scale = dropout, scale

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """q ``[B, H, Tq, D]``, k/v ``[B, Hkv, Tk, D]`` -> ``[B, H, Tq, D]``."""
        self.check_inputs(q, k, v, attn_mask)
        dropout_p = self.dropout if self.training else 0.0
        return self._attend(q, k, v, attn_mask, self.causal, dropout_p, self.scale)

    def attend_blocks(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        block_mask: Callable[[], BlockMask],
        score_mod: Callable[..., torch.Tensor] | None = None,
    ) -> torch.Tensor | None:
        """FlexAttention under ``block_mask()``, which already holds the causal rule, whatever the
        backend; None while attention dropout is on, which FlexAttention lacks."""
        if self.training and self.dropout > 0.0:
            return None
        self.check_inputs(q, k, v, None)
        return flex_attention_for(q)(
            q, k, v, score_mod=score_mod, block_mask=block_mask(), scale=self.scale,
            enable_gqa=int(k.shape[1]) != int(q.shape[1]),
        )  # fmt: skip
