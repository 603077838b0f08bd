"""Sampling text from a decoder LM past the window it was trained on, deterministically for a seed.

A model has learned positions 0..window-1 only (its ``train.seq_len``, or ``max_seq_len``), so the
context it reads never grows past ``window`` tokens. Decoding runs on the KV cache; when the cache is
full, the oldest ``slide`` tokens are dropped and the cache is refilled from the ``window - slide``
newest ones in one forward pass (their positions start at 0 again, as in training). ``slide=1`` is
exactly nanoGPT's crop-and-recompute; the default, a quarter of the window, costs one refill pass
every ``window / 4`` tokens. Models without a KV cache recompute the cropped context every token.
"""

from __future__ import annotations

import torch
from torch import nn


def next_token(
    logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator
) -> torch.Tensor:
    """logits [B, vocab] -> ids [B, 1]: greedy at temperature 0, else drawn from the softmax of
    ``logits / temperature`` over the ``top_k`` largest (all when None).

    The draw runs on CPU from ``generator`` (a CPU generator), so a seed gives the same text on any
    device.
    """
    logits = logits.float().cpu()
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1, generator=generator)


@torch.no_grad()
def sample_ids(
    model: nn.Module,
    prompt: torch.Tensor,
    max_new_tokens: int,
    *,
    window: int,
    temperature: float = 0.8,
    top_k: int | None = None,
    seed: int = 0,
    slide: int | None = None,
) -> torch.Tensor:
    """Continue ``prompt`` (LongTensor[T], T >= 1) by ``max_new_tokens`` ids; returns LongTensor[T + N].

    ``model(ids [1, t]) -> logits [1, t, vocab]``; with ``new_cache()`` (brickwork's DecoderLM) it also
    takes ``cache=``. ``window``: the most tokens the model reads at once; ``slide``: how many of
    them a full cache drops (default ``window // 4``).
    """
    if prompt.dim() != 1 or prompt.numel() == 0:
        raise ValueError(f"prompt must be a non-empty 1-D tensor of ids, got shape {tuple(prompt.shape)}")
    if window < 1 or max_new_tokens < 0:
        raise ValueError(f"need window >= 1 and max_new_tokens >= 0, got {window} and {max_new_tokens}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    slide = max(1, window // 4) if slide is None else slide
    if not 1 <= slide <= window:
        raise ValueError(f"slide must be in 1..window={window}, got {slide}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    ids = prompt.tolist()
    cached = hasattr(model, "new_cache")
    try:
        logits, cache = _refill(model, ids[-window:], device, cached)
        for _ in range(max_new_tokens):
            token = int(next_token(logits[:, -1], temperature, top_k, generator))
            ids.append(token)
            if not cached or cache[0].length >= window:
                logits, cache = _refill(
                    model, ids[-(window - slide + 1 if cached else window) :], device, cached
                )
            else:
                logits = model(torch.tensor([[token]], device=device), cache=cache)
    finally:
        model.train(was_training)
    return torch.tensor(ids, dtype=torch.long)


def _refill(model: nn.Module, context: list[int], device: torch.device, cached: bool):
    """Logits of ``context`` from a fresh cache (or none), and that cache."""
    ids = torch.tensor([context], device=device)
    if not cached:
        return model(ids), None
    cache = model.new_cache()
    return model(ids, cache=cache), cache
