"""Packed documents: each token attends causally within its own document, and its position restarts at 0.

A row of a packed batch holds several documents one after another; ``document_ids`` [B, T] say which
token belongs to which (a document is one run of equal ids). The model builds one
:class:`DocumentMask` per forward and hands it to every attention layer in place of ``attn_mask``. Its
one rule, ``mask_mod(b, h, q, kv)``: same document and ``kv <= q``, runs as a FlexAttention block mask
(built once, with the mask on CUDA and on first use elsewhere, then shared by all layers; no head dim,
so it broadcasts over whatever heads a rank holds). FlexAttention has no backward on CPU (torch 2.13)
and no attention dropout, so there, and for a mechanism without a block-mask path, the same rule is
evaluated once into a dense boolean mask [B, 1, T, T].

The queries may be the last rows only (``queries``, bottom-right aligned like every causal mask here):
context parallel gives a rank the queries of its slice of the sequence and the keys up to its end.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Protocol

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from brickwork.components.attention.base import AttentionMechanism
from brickwork.components.attention.masks import add_bias, causal_keep, document_mask

ScoreMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class PositionBiasHook(Protocol):
    """An additive position bias (ALiBi): ``[H, tq, tk]`` for a dense mask, or the same bias as a
    FlexAttention ``score_mod``."""

    def __call__(self, tq: int, tk: int, device: torch.device | str | None = None) -> torch.Tensor: ...

    def score_mod(self) -> ScoreMod: ...


@functools.cache
def _compiled_create_block_mask() -> Callable[..., BlockMask]:
    # On CUDA, eager create_block_mask evaluates the rule over the whole [B, T, T] grid.
    return torch.compile(create_block_mask, dynamic=False)


def document_positions(document_ids: torch.Tensor) -> torch.Tensor:
    """[B, T] document ids -> [B, T] positions, 0 at each document's first token of the row."""
    index = torch.arange(document_ids.shape[1], device=document_ids.device).expand_as(document_ids)
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    first = torch.where(starts, index, 0).cummax(dim=1).values  # the start of each token's document
    return index - first


def document_causal(document_ids: torch.Tensor, shift: int = 0) -> Callable[..., torch.Tensor]:
    """FlexAttention's ``mask_mod(b, h, q_idx, kv_idx)`` of packed rows: the same document, not after.
    Query row ``q_idx`` is position ``q_idx + shift`` of ``document_ids`` (the key positions)."""

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        q = q_idx + shift
        return (document_ids[b, q] == document_ids[b, kv_idx]) & (kv_idx <= q)

    return mask_mod


def shifted_score_mod(score_mod: ScoreMod, shift: int) -> ScoreMod:
    """``score_mod`` with query row ``q_idx`` placed at key position ``q_idx + shift``."""
    if shift == 0:
        return score_mod

    def mod(
        score: torch.Tensor, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        return score_mod(score, b, h, q_idx + shift, kv_idx)

    return mod


class DocumentMask:
    """Document-causal attention for one batch of packed rows, ``document_ids`` [B, T] (integers).

    ``queries`` (default T) makes the query rows the last ``queries`` positions only, attending to all
    T keys: [B, queries, T] masks, positions of those rows. Pass it as a layer's ``attn_mask``;
    :meth:`attend` runs it. The block mask and the dense mask are each built at most once, so every
    layer of a forward shares them.
    """

    def __init__(self, document_ids: torch.Tensor, queries: int | None = None) -> None:
        if not isinstance(document_ids, torch.Tensor) or document_ids.dim() != 2:
            raise ValueError(f"document_ids must be a tensor [B, T], got {document_ids!r}")
        if document_ids.dtype.is_floating_point or document_ids.dtype == torch.bool:
            raise TypeError(f"document_ids must hold integers, got dtype {document_ids.dtype}")
        length = document_ids.shape[1]
        queries = length if queries is None else queries
        if isinstance(queries, bool) or not isinstance(queries, int) or not 0 < queries <= length:
            raise ValueError(f"queries must be an integer in [1, {length}], got {queries!r}")
        self.document_ids, self.queries = document_ids, queries
        self.shift = length - queries  # the key position of the first query row
        self.mask_mod = document_causal(document_ids, self.shift)
        self._block: BlockMask | None = None
        self._dense: torch.Tensor | None = None
        if document_ids.is_cuda:  # the path there: built now, before any compiled layer sees the mask
            self.block_mask()

    def positions(self) -> torch.Tensor:
        """Each query token's position within its document, [B, queries]."""
        return document_positions(self.document_ids)[:, self.shift :]

    def block_mask(self) -> BlockMask:
        """The rule as a FlexAttention block mask [B, 1 (broadcast over heads), queries, T]."""
        if self._block is None:
            rows, length = self.document_ids.shape
            create = _compiled_create_block_mask() if self.document_ids.is_cuda else create_block_mask
            device = self.document_ids.device
            self._block = create(self.mask_mod, rows, None, self.queries, length, device=device)
        return self._block

    def dense(self) -> torch.Tensor:
        """The rule as a boolean mask [B, 1, queries, T] (True = may attend): the same document
        (:func:`~brickwork.components.attention.masks.document_mask`), not after."""
        if self._dense is None:
            ids = self.document_ids
            keep = causal_keep(self.queries, ids.shape[1], ids.device)  # bottom-right: row i is i + shift
            self._dense = document_mask(ids[:, self.shift :], ids) & keep
        return self._dense

    def attend(
        self,
        mechanism: AttentionMechanism,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        position_bias: PositionBiasHook | None = None,
    ) -> torch.Tensor:
        """q ``[B, H, queries, D]``, k/v ``[B, Hkv, T, D]`` -> ``[B, H, queries, D]``, with
        ``position_bias`` (ALiBi) added to the scores. Through the mechanism's block-mask path where it
        has one and FlexAttention can run (not a CPU backward), else its ordinary forward with the dense
        mask (plus the bias, asked for ``(queries, T)``: bottom-right aligned, as the rows are)."""
        if mechanism.mask_support != "full":
            raise ValueError(
                f"{type(mechanism).__name__} cannot keep packed documents apart: it takes "
                f"{mechanism.mask_support!r} masks, and a document mask needs full ones"
            )
        if q.shape[-2] != self.queries or k.shape[-2] != self.document_ids.shape[1]:
            raise ValueError(
                f"document_ids cover {self.queries} queries and {self.document_ids.shape[1]} keys, but "
                f"the queries have {q.shape[-2]} and the keys {k.shape[-2]} (a document mask takes no "
                "KV cache)"
            )
        backward_on_cpu = q.device.type == "cpu" and any(t.requires_grad for t in (q, k, v))
        if not backward_on_cpu:
            score_mod = (
                None if position_bias is None else shifted_score_mod(position_bias.score_mod(), self.shift)
            )
            out = mechanism.attend_blocks(q, k, v, self.block_mask, score_mod)
            if out is not None:
                return out
        mask = self.dense()
        if position_bias is not None:
            mask = add_bias(mask, position_bias(q.shape[-2], k.shape[-2], q.device).to(q.dtype))
        # The mechanism's method, as for the block path: the keys given here are final, so a hook on
        # its call that would supply keys (context parallel's gather) is not run a second time.
        return mechanism.forward(q, k, v, mask)
