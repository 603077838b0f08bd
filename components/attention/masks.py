"""Mask helpers shared by the mechanisms and the multi-head layer.

Masks follow torch SDPA: boolean True = may attend, float = added to the scores. Causal masks are
aligned to the bottom-right corner, so that with a KV cache (Tk > Tq) query i sits at absolute
position ``i + Tk - Tq`` and sees every earlier key.
"""

from __future__ import annotations

import functools

import torch


def causal_keep(tq: int, tk: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean ``[tq, tk]``: True where key j is not after query i (bottom-right aligned).

    Read-only: the same tensor is handed out for the same shape and device, so that a forward pass
    does not rebuild it in every layer. Under ``torch.compile`` it is built in the graph instead, where
    Inductor computes it inside the kernel that uses it (dynamo cannot trace the cache; it would bypass
    it and warn).
    """
    device = torch.device(device) if device is not None else torch.device("cpu")
    if torch.compiler.is_compiling():
        return _build_causal_keep(tq, tk, device)
    return _cached_causal_keep(tq, tk, device)


def _build_causal_keep(tq: int, tk: int, device: torch.device) -> torch.Tensor:
    return torch.ones(tq, tk, dtype=torch.bool, device=device).tril(tk - tq)


_cached_causal_keep = functools.lru_cache(maxsize=16)(_build_causal_keep)


def restrict(mask: torch.Tensor | None, keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Combine ``mask`` (bool, float or None) with a boolean ``keep`` pattern.

    Returns a boolean mask when ``mask`` is None or boolean, else an additive mask of ``dtype`` with
    -inf where ``keep`` is False.
    """
    if mask is None:
        return keep
    if mask.dtype == torch.bool:
        return mask & keep
    return mask.to(dtype).masked_fill(~keep, float("-inf"))


def add_bias(mask: torch.Tensor | None, bias: torch.Tensor) -> torch.Tensor:
    """Merge an additive ``bias`` (e.g. ALiBi, ``[H, Tq, Tk]``) into ``mask``; the result is additive."""
    if mask is None:
        return bias
    if mask.dtype == torch.bool:
        return bias.masked_fill(~mask, float("-inf"))
    return mask.to(bias.dtype) + bias


def rows_with_keys(mask: torch.Tensor) -> torch.Tensor:
    """Boolean of shape ``mask.shape[:-1]``: True for query rows that may attend to at least one key."""
    if mask.dtype == torch.bool:
        return mask.any(dim=-1)
    return (mask > float("-inf")).any(dim=-1)


def open_rows(mask: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """Let rows with no key (``~live``) attend everywhere, so softmax stays finite there.

    The caller zeroes those rows' outputs afterwards; their gradients then vanish instead of being NaN.
    """
    empty = ~live[..., None]
    if mask.dtype == torch.bool:
        return mask | empty
    return mask.masked_fill(empty, 0.0)


def key_padding_keep(mask: torch.Tensor) -> torch.Tensor:
    """A ``[B|1, H|1, 1, Tk]`` boolean key-padding mask as ``[B|1, H|1, Tk, 1]`` for scaling k/v rows."""
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    return mask.transpose(-2, -1)


def document_mask(document_ids: torch.Tensor, key_document_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean ``[B, 1, Tq, Tk]``: True where query and key belong to the same packed document.

    ``document_ids`` ``[B, Tq]`` gives each token's document (any integers; equal = same document);
    ``key_document_ids`` ``[B, Tk]`` defaults to it. Pass it as ``attn_mask``: a causal mechanism adds
    its own causal rule on top, so packed sequences train as if each document were alone.
    """
    keys = document_ids if key_document_ids is None else key_document_ids
    if document_ids.dim() != 2 or keys.dim() != 2 or keys.shape[0] != document_ids.shape[0]:
        raise ValueError(
            f"document ids must be [B, T] with one batch size, got {tuple(document_ids.shape)} and "
            f"{tuple(keys.shape)}"
        )
    return (document_ids[:, :, None] == keys[:, None, :]).unsqueeze(1)
