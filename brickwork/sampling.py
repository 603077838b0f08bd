"""brickwork's one sampler: the loop behind ``DecoderLM.generate`` and ``brickwork sample``.

:func:`generate_ids` continues a batch of prompts, greedily or drawn (temperature, top-k, top-p),
deterministically for a generator, stopping a row at an end-of-sequence id. Prompts of different
lengths are left-padded with an ``attention_mask`` (1 = real token, 0 = padding), as HF's
``generate`` takes them; each row's positions then start at its first real token, so a padded
batch gives each prompt the tokens it gets alone (while it fits the window; see below). Greedy
decoding gives HF's ``generate(do_sample=False)`` tokens for the same weights.

A model has learned positions 0..window-1 only (its ``train.seq_len``, or ``max_seq_len``), so the
context it reads never grows past ``window`` tokens. Decoding runs on the KV cache; when the cache is
full, the oldest ``slide`` tokens are dropped and the cache is refilled from the ``window - slide``
newest ones in one forward pass (their positions start at 0 again, as in training). ``slide=1`` is
exactly nanoGPT's crop-and-recompute; the default, a quarter of the window, costs one refill pass
every ``window / 4`` tokens. Models without a KV cache recompute the cropped context every token.
The window counts columns of the batch: a left-padded row's padding takes part of it.

The options are checked before anything runs (``check_options``), each error naming its keyword: a
window past the positions a model has (its ``max_seq_len``) is refused rather than cut down to it,
since the caller asked for that many tokens of context.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from brickwork.errors import ConfigError

SEEDS = 2**64  # torch.Generator.manual_seed takes the seeds 0 .. 2**64 - 1


def next_token(
    logits: torch.Tensor,
    temperature: float,
    top_k: int | None,
    generator: torch.Generator | None,
    top_p: float | None = None,
) -> torch.Tensor:
    """logits [B, vocab] -> ids [B, 1]: greedy at temperature 0, else drawn from the softmax of
    ``logits / temperature`` over the ``top_k`` largest (all when None), then over the fewest most
    likely tokens whose probabilities reach ``top_p`` (nucleus sampling; all when None).

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
    if top_p is not None and top_p < 1:
        scaled = _nucleus(scaled, top_p)
    return torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=generator)


def _nucleus(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """-inf for every token outside the nucleus: the most likely tokens, in order, up to and including
    the one whose cumulative probability reaches ``top_p``. The most likely token always stays."""
    ordered, order = logits.sort(dim=-1, descending=True)
    probs = ordered.softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # the probability of the tokens ranked above each one
    outside = (before >= top_p).scatter(-1, order, before >= top_p)
    return logits.masked_fill(outside, float("-inf"))


def check_options(
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    seed: int | None = None,
    window: int | None = None,
    top_p: float | None = None,
) -> None:
    """ConfigError naming the keyword of :func:`generate_ids` / :func:`sample_ids` whose value cannot be
    used: counts below their least, a temperature that is not a finite number >= 0, a ``top_p`` outside
    (0, 1], a seed no generator takes."""
    for key, value, least in (
        ("max_new_tokens", max_new_tokens, 0),
        ("top_k", top_k, 1),
        ("window", window, 1),
    ):
        if value is not None and value < least:
            raise ConfigError(f"must be an integer >= {least}, got {value}", key)
    if not math.isfinite(temperature) or temperature < 0:
        raise ConfigError(f"must be a finite number >= 0 (0 = greedy), got {temperature}", "temperature")
    if top_p is not None and not 0 < top_p <= 1:
        raise ConfigError(f"must be a probability in (0, 1], got {top_p}", "top_p")
    if seed is not None and not 0 <= seed < SEEDS:
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
def generate_ids(
    model: nn.Module,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    attention_mask: torch.Tensor | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    generator: torch.Generator | None = None,
    window: int | None = None,
    slide: int | None = None,
) -> torch.Tensor:
    """Continue the prompts ``input_ids`` [B, T] by up to ``max_new_tokens`` ids; returns [B, T + N].

    ``model(ids [B, t]) -> logits [B, t, vocab]``; with ``new_cache()`` (brickwork's DecoderLM) it
    also takes ``cache=``, and for a padded batch ``attention_mask=`` and ``position_ids=`` (HF's
    meaning). ``attention_mask`` [B, T]: 1 = real token, 0 = left padding. A row that draws an id of
    ``eos_token_id`` is finished: it gets ``pad_token_id`` (default: the first end-of-sequence id) from
    then on, and decoding stops once every row is, so N may be below ``max_new_tokens``.
    ``temperature`` 0 is greedy; ``generator`` (a CPU generator) fixes the draws. ``window``: the most
    tokens the model reads at once, at most and by default its ``max_seq_len`` (no limit without one);
    ``slide``: how many of them a full cache drops (default ``window // 4``). The model runs in eval
    mode and gets its own mode back. A bad option is a ConfigError (a ValueError) naming it.
    """
    check_ids(input_ids, attention_mask)
    check_options(max_new_tokens, temperature, top_k, None, window, top_p)
    window = getattr(model, "max_seq_len", None) if window is None else window
    if window is not None:
        check_window(model, window)
    slide = max(1, window // 4) if slide is None and window is not None else slide
    if window is not None and not 1 <= slide <= window:
        raise ValueError(f"slide must be in 1..window={window}, got {slide}")
    eos = None if eos_token_id is None else torch.tensor(eos_token_id).flatten()
    if pad_token_id is None and eos is not None:
        pad_token_id = int(eos[0])
    device = next(model.parameters()).device
    decoder = _Decoder(model, input_ids.to(device), attention_mask, window, slide)
    finished = torch.zeros(input_ids.shape[0], dtype=torch.bool)
    was_training = model.training
    model.eval()
    try:
        logits = decoder.refill()
        for step in range(max_new_tokens):
            token = next_token(_last(logits), temperature, top_k, generator, top_p)
            if eos is not None:
                token = token.masked_fill(finished[:, None], pad_token_id)
                finished |= torch.isin(token[:, 0], eos)
            decoder.append(token.to(device))
            if bool(finished.all()) or step + 1 == max_new_tokens:
                break
            logits = decoder.step()
    finally:
        model.train(was_training)
    return decoder.ids.to(input_ids.device)


def check_ids(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
    """ValueError unless ``input_ids`` are integer prompts [B, T >= 1] and ``attention_mask`` (when
    given) has their shape."""
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.shape[1] == 0:
        shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
        raise ValueError(f"input_ids must be prompts [B, T] with T >= 1, got {shape}")
    if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
        raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if attention_mask is not None and tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise ValueError(
            f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, "
            f"got {tuple(attention_mask.shape)}"
        )


def _last(logits: torch.Tensor) -> torch.Tensor:
    """The last position's logits [B, vocab], whole: tensor parallel leaves them split over the
    vocabulary."""
    last = logits[:, -1]
    return last.full_tensor() if isinstance(last, DTensor) else last


class _Decoder:
    """The growing ids [B, t] of a batch, and the model's context over their newest columns: a KV cache
    (refilled when full) or, for a model without one, the window recomputed each token."""

    def __init__(
        self,
        model: nn.Module,
        ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        window: int | None,
        slide: int | None,
    ) -> None:
        self.model, self.ids, self.window, self.slide = model, ids, window, slide
        mask = torch.ones_like(ids) if attention_mask is None else attention_mask.to(ids.device).long()
        self.mask = mask
        # Positions and a mask go to the model only where some row is padded: a model without
        # padding support (any ``model(ids)``) still decodes unpadded prompts.
        self.padded = attention_mask is not None and not bool(mask.all())
        self.cache: list[Any] | None = None
        self.start = 0 if window is None else max(0, ids.shape[1] - window)

    def append(self, token: torch.Tensor) -> None:
        self.ids = torch.cat([self.ids, token], dim=1)
        self.mask = torch.cat([self.mask, torch.ones_like(token)], dim=1)

    def refill(self) -> torch.Tensor:
        """Logits of the context since ``start``, from a fresh cache (or none)."""
        context = self.ids[:, self.start :]
        if not hasattr(self.model, "new_cache"):
            return self.model(context, **self._padding(0))
        self.cache = self.model.new_cache()
        return self.model(context, cache=self.cache, **self._padding(0))

    def step(self) -> torch.Tensor:
        """Logits after the newest token: from the cache, or from a refill when the cache is full (or
        there is none)."""
        length = self.ids.shape[1]
        if self.cache is None:
            self.start = 0 if self.window is None else max(0, length - self.window)
            return self.refill()
        if self.window is not None and self.cache[0].length >= self.window:
            self.start = length - (self.window - self.slide + 1)
            return self.refill()
        return self.model(self.ids[:, -1:], cache=self.cache, **self._padding(length - 1 - self.start))

    def _padding(self, first: int) -> dict[str, torch.Tensor]:
        """The mask over the context, and the positions of its columns from ``first`` on: each row's
        real tokens count from 0 at the start of the context (HF's ``cumsum(mask) - 1``)."""
        if not self.padded:
            return {}
        mask = self.mask[:, self.start :]
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
        return {"attention_mask": mask, "position_ids": positions[:, first:]}


@torch.no_grad()
def sample_ids(
    model: nn.Module,
    prompt: torch.Tensor,
    max_new_tokens: int,
    *,
    window: int,
    temperature: float = 0.8,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    slide: int | None = None,
) -> torch.Tensor:
    """Continue ``prompt`` (LongTensor[T], T >= 1) by ``max_new_tokens`` ids; returns LongTensor[T + N].

    :func:`generate_ids` for one prompt, drawn from a CPU generator seeded with ``seed``. ``window``:
    the most tokens the model reads at once, at most its ``max_seq_len``; ``slide``: how many of them a
    full cache drops (default ``window // 4``). A bad option is a ConfigError (a ValueError) naming it
    (:func:`check_options`, :func:`check_window`).
    """
    if prompt.dim() != 1 or prompt.numel() == 0:
        raise ValueError(f"prompt must be a non-empty 1-D tensor of ids, got shape {tuple(prompt.shape)}")
    check_options(max_new_tokens, temperature, top_k, seed, window, top_p)
    check_window(model, window)
    generator = torch.Generator().manual_seed(seed)
    out = generate_ids(
        model, prompt[None], max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
        generator=generator, window=window, slide=slide,
    )  # fmt: skip
    return out[0].cpu()
