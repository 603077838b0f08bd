"""The keywords HF's code passes a forward that brickwork's classes read alike."""

from __future__ import annotations

from typing import Any

import transformers


def cache_argument(cache: transformers.Cache | None, kwargs: dict[str, Any]) -> transformers.Cache | None:
    """The cache, under either name transformers has given it."""
    older = kwargs.pop("past_key_values", None)
    if cache is not None and older is not None:
        raise ValueError("give cache or past_key_values (its older name), not both")
    return cache if cache is not None else older


def refuse_unknown(kwargs: dict[str, Any]) -> None:
    """What HF may pass that brickwork has no use for: attention maps (brickwork's mechanisms return
    none) and input embeddings (brickwork models read ids) are refused when asked for; any other
    keyword is a TypeError, never dropped."""
    if kwargs.pop("output_attentions", None):
        raise ValueError("output_attentions: brickwork's attention mechanisms do not return attention maps")
    if kwargs.pop("inputs_embeds", None) is not None:
        raise ValueError("inputs_embeds: brickwork models embed their input_ids themselves")
    if kwargs:
        raise TypeError(f"forward got unexpected keyword arguments {sorted(kwargs)}")
