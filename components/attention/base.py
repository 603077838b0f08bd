"""The attention family: the mechanism base class, its registry and option checks shared by its members."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar

import torch
from torch.nn.attention.flex_attention import BlockMask

from brickwork.components.configurable import Configurable
from brickwork.registry import Registry


class AttentionMechanism(Configurable):
    """Base of every mechanism: ``forward(q, k, v, attn_mask=None) -> out``.

    q ``[B, H, Tq, D]``, k/v ``[B, H, Tk, D]`` (``[B, Hkv, Tk, D]`` when ``supports_gqa``), out
    ``[B, H, Tq, D]``. ``attn_mask`` is boolean (True = may attend) or additive float, broadcastable to
    ``[B, H, Tq, Tk]``. Class attributes describe what a mechanism can do, so that callers (the
    multi-head layer, the factory, the tests) never have to guess:

    - ``causal_safe``: with ``causal=True``, position i never sees j > i.
    - ``mask_support``: ``"full"`` (any mask), ``"key_padding"`` (boolean masks over keys only, i.e.
      size 1 along Tq) or ``"none"``. A mask the mechanism cannot honour raises instead of being ignored.
    - ``supports_gqa``: k/v may carry fewer heads than q (each kv head serves ``H / Hkv`` query heads).
    - ``needs``: head geometry (``"num_heads"``, ``"dim_head"``) the multi-head layer passes in.
    - ``requires_input_projection``: False for token mixers that work on the layer input itself; their
      output stands at v's positions, so they take as many queries as values.
    - ``context_parallel_safe``: exact softmax attention of q over k, v and nothing else, so its keys
      and values may be gathered from sequence slices held by other ranks (context parallel).

    Packed documents (``components/attention/document_mask.py``) run on any mechanism with
    ``mask_support="full"``: through :meth:`attend_blocks` where it runs FlexAttention, else through
    ``forward`` with the dense document mask.
    """

    causal_safe: ClassVar[bool] = False
    mask_support: ClassVar[str] = "full"
    supports_gqa: ClassVar[bool] = False
    needs: ClassVar[tuple[str, ...]] = ()
    requires_input_projection: ClassVar[bool] = True
    context_parallel_safe: ClassVar[bool] = False
    causal: bool = False

    def attend_blocks(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        block_mask: Callable[[], BlockMask],
        score_mod: Callable[..., torch.Tensor] | None = None,
    ) -> torch.Tensor | None:
        """``[B, H, T, D]`` attention under the FlexAttention block mask ``block_mask()`` returns (built
        when first asked) and ``score_mod``; None where this mechanism has no such path (here: none)."""
        return None

    @classmethod
    def option_names(cls) -> list[str]:
        """The options accepted by the constructor (the fields of ``Config``)."""
        return [f.name for f in dataclasses.fields(cls.Config)]

    def check_inputs(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None
    ) -> None:
        """Raise ValueError on inconsistent q/k/v shapes or a mask this mechanism cannot honour."""
        name = type(self).__name__
        for label, t in (("q", q), ("k", k), ("v", v)):
            if t.dim() != 4:
                raise ValueError(f"{name}: {label} must be [B, H, T, D], got shape {tuple(t.shape)}")
        if k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
            raise ValueError(
                f"{name}: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} disagree on batch, "
                "key length or head dim"
            )
        hq, hk = q.shape[1], k.shape[1]
        if hq != hk and not (self.supports_gqa and hk > 0 and hq % hk == 0):
            hint = "q heads must be a multiple of kv heads" if self.supports_gqa else "expand kv heads first"
            raise ValueError(f"{name}: q has {hq} heads but k/v have {hk}; {hint}")
        if attn_mask is not None:
            check_mask(name, self.mask_support, attn_mask, (q.shape[0], hq, q.shape[2], k.shape[2]))
        if not self.requires_input_projection and q.shape[-2] != v.shape[-2]:
            raise ValueError(f"{name} needs as many queries as values, got {q.shape[-2]} and {v.shape[-2]}")


def check_mask(name: str, support: str, mask: torch.Tensor, full: tuple[int, int, int, int]) -> None:
    """Raise ValueError unless ``mask`` broadcasts to ``full`` = (B, H, Tq, Tk) and ``support`` allows it."""
    if support == "none":
        raise ValueError(
            f"{name} takes no attn_mask (it mixes every token); got one of shape {tuple(mask.shape)}"
        )
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise ValueError(f"{name}: attn_mask must be boolean or float, got dtype {mask.dtype}")
    try:
        ok = torch.broadcast_shapes(mask.shape, full) == torch.Size(full)
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"{name}: attn_mask of shape {tuple(mask.shape)} does not broadcast to {full}")
    if support == "key_padding" and (mask.dtype != torch.bool or (mask.dim() >= 2 and mask.shape[-2] != 1)):
        raise ValueError(
            f"{name} supports only boolean key-padding masks of shape [B, 1, 1, Tk]; got "
            f"{mask.dtype} mask of shape {tuple(mask.shape)}"
        )


ATTENTION_REGISTRY: Registry[AttentionMechanism] = Registry("attention", AttentionMechanism)


def register_attention(name: str):
    """Decorator registering an :class:`AttentionMechanism` subclass under ``name``."""
    return ATTENTION_REGISTRY.register(name)
