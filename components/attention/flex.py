"""FlexAttention as the mechanisms call it: compiled once per process on CUDA, eager elsewhere."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch
from torch.nn.attention.flex_attention import flex_attention


@functools.cache
def compiled_flex_attention() -> Callable[..., torch.Tensor]:
    """``flex_attention`` under ``torch.compile``, compiled once per process on first use."""
    # Only on first CUDA use: eager FlexAttention materializes the scores.
    return torch.compile(flex_attention, dynamic=False)


def eager_flex_attention(*args: object, **kwargs: object) -> torch.Tensor:
    """``flex_attention`` run eagerly, without torch's advice to compile it: off CUDA, eager (the
    scores materialized) is the path brickwork chooses, so the advice would only be noise."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(*args, **kwargs)


def flex_attention_for(q: torch.Tensor) -> Callable[..., torch.Tensor]:
    """``flex_attention`` itself inside a compiled region (whose compiler fuses it); else the compiled
    kernel for CUDA tensors, and the eager function for others (CPU runs it eagerly)."""
    if torch.compiler.is_compiling():
        return flex_attention
    return compiled_flex_attention() if q.is_cuda else eager_flex_attention
