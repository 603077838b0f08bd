"""xformers' ``Attention`` base class and ``AttentionConfig``: capability flags set per instance."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from brickwork.xformers.utils import FromConfig


@dataclasses.dataclass
class AttentionConfig:
    """The keys every attention config has; registered configs subclass it."""

    name: str
    dropout: float


class Attention(FromConfig, nn.Module):
    """Base of xformers-style mechanisms: ``forward(q, k, v, att_mask=None, key_padding_mask=None)`` on
    q ``[B*H, Tq, D]`` and k/v ``[B*H, Tk, D]`` (``[B, H, T, D]`` when ``requires_head_dimension``).

    The flags are instance attributes, as in xformers, so a caller may switch them per instance.
    """

    def __init__(self, dropout: float | None = None, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.requires_input_projection = True
        self.requires_head_dimension = False
        self.requires_separate_masks = False
        self.requires_same_k_q_dimensions = False
        self.requires_skip_multi_head = False
        self.requires_squared_context = False
        self.supports_attention_mask = True
        self.supports_key_padding_mask = False
