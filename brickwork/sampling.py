"""Sampling text from a decoder LM past the window it was trained on, deterministically for a seed.

A model has learned positions 0..window-1 only (its ``train.seq_len``, or ``max_seq_len``), so the
context it reads never grows past ``window`` tokens. Decoding runs on the KV cache; when the cache is
full, the oldest ``slide`` tokens are dropped and the cache is refilled from the ``window - slide``
newest ones in one forward pass (their positions start at 0 again, as in training). ``slide=1`` is
exactly nanoGPT's crop-and-recompute; the default, a quarter of the window, costs one refill pass
every ``window / 4`` tokens. Models without a KV cache recompute the cropped context every token.

The options are checked before anything runs (``check_options``), each error naming its keyword: a
window past the positions a model has (its ``max_seq_len``) is refused rather than cut down to it,
since the caller asked for that many tokens of context.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from brickwork.errors import ConfigError

SEEDS = 2**64  # torch.Generator.manual_seed takes the seeds 0 .. 2**64 - 1


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
    # In float64, which holds any temperature a float does, with the largest logit shifted to 0: a
    # tiny temperature then sends the others to -inf (greedy in the limit), never to inf - inf = nan.
    scaled = (logits.double() - logits.max(dim=-1, keepdim=True).values.double()) / temperature
    return torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=generator)


def check_options(
    max_new_tokens: int, temperature: float, top_k: int | None, seed: int, window: int | None
) -> None:
    """ConfigError naming the keyword of :func:`sample_ids` whose value cannot be used: counts below
    their least, a temperature that is not a finite number >= 0, a seed no generator takes."""
    for key, value, least in (
        ("max_new_tokens", max_new_tokens, 0),
        ("top_k", top_k, 1),
        ("window", window, 1),
    ):
        if value is not None and value < least:
            raise ConfigError(f"must be an integer >= {least}, got {value}", key)
    if not math.isfinite(temperature) or temperature < 0:
        raise ConfigError(f"must be a finite number >= 0 (0 = greedy), got {temperature}", "temperature")
    if not 0 <= seed < SEEDS:
        raise ConfigError(f"must be in 0 .. 2**64 - 1, got {seed}", "seed")


def check_window(model: nn.Module, window: int) -> None:
    """ConfigError naming ``window`` when it is past the positions ``model`` has (its ``max_seq_len``)."""
    positions = getattr(model, "max_seq_len", None)
    if positions is not None and window > positions:
        raise ConfigError(
            f"{window} tokens is past the {positions} positions the model has (its max_seq_len); "
            f"give at most {positions}",
            "window",
        )


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
    takes ``cache=``. ``window``: the most tokens the model reads at once, at most its ``max_seq_len``;
    ``slide``: how many of them a full cache drops (default ``window // 4``). A bad option is a
    ConfigError (a ValueError) naming it (:func:`check_options`, :func:`check_window`).
    """
    if prompt.dim() != 1 or prompt.numel() == 0:
        raise ValueError(f"prompt must be a non-empty 1-D tensor of ids, got shape {tuple(prompt.shape)}")
    check_options(max_new_tokens, temperature, top_k, seed, window)
    check_window(model, window)
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
