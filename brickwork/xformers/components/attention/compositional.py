"""xformers' ``CompositionalAttention``: its own projections around brickwork's ``compositional``."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from brickwork.components.attention import CompositionalAttention as BrickworkCompositional
from brickwork.factory.xformers.stack import compositional_selection
from brickwork.xformers._compat import as_int, require
from brickwork.xformers.components.attention.core import MaskLike
from brickwork.xformers.components.attention.mechanisms import BrickworkAttention
from brickwork.xformers.components.input_projection import InputProjection, InputProjectionConfig


class CompositionalAttention(BrickworkAttention):
    """Searches (query/key heads) times rules (value mixes), each search choosing its rules: the layer
    owns its input and output projections, so the multi-head layer hands it the raw ``[B, T, E]``
    inputs (``requires_skip_multi_head``).

    ``qk_rule`` scores the rules by a dot product, else by a score network (two layers when
    ``nonlinear``): brickwork's ``selection`` ``"dot"``, ``"mlp"`` or ``"linear"``. The selection query
    is always the head's projected query (xformers' ``q_compose=True``); ``q_compose=False``, which
    projected the raw input instead, is accepted and runs the same way. ``dim_attn``, ``dim_key`` and
    ``dim_value`` must equal ``dim_model``."""

    def __init__(
        self,
        dim_model: int,
        num_heads: int,
        dim_attn: int | None = None,
        num_rules: int | None = None,
        dim_selection: int | None = None,
        dim_key: int | None = None,
        dim_value: int | None = None,
        dropout: float = 0.0,
        qk_rule: bool = False,
        nonlinear: bool = False,
        q_compose: bool = False,
        in_proj_container: InputProjection | None = None,
        use_separate_proj_weight: bool | None = False,
        bias: bool = True,
        causal: bool = False,
        *_: Any,
        **__: Any,
    ) -> None:
        super().__init__()
        dim_model, num_heads = as_int(dim_model), as_int(num_heads)
        for option, value in (("dim_attn", dim_attn), ("dim_key", dim_key), ("dim_value", dim_value)):
            require(value in (None, dim_model), f"{option}={value} must equal dim_model={dim_model} here")
        require(
            dim_model % num_heads == 0, f"dim_model={dim_model} is not divisible by num_heads={num_heads}"
        )
        self.dim_model, self.num_heads, self.causal = dim_model, num_heads, causal
        self.qk_rule, self.nonlinear, self.q_compose = qk_rule, nonlinear, q_compose
        self.in_proj_container = in_proj_container or InputProjection(
            InputProjectionConfig(dim_model, dim_model, bias),
            InputProjectionConfig(dim_model, dim_model, bias) if use_separate_proj_weight else None,
            InputProjectionConfig(dim_model, dim_model, bias) if use_separate_proj_weight else None,
        )
        self.mechanism = BrickworkCompositional(
            num_heads=num_heads, dim_head=dim_model // num_heads, num_rules=as_int(num_rules),
            dim_selection=as_int(dim_selection), causal=causal, dropout=float(dropout),
            selection=compositional_selection(qk_rule, nonlinear),
        )  # fmt: skip
        self.out_proj = nn.Linear(dim_model, dim_model, bias=bias)
        self.requires_skip_multi_head = True

    def forward(self, q, k, v, att_mask: MaskLike | None = None, *_: Any, **__: Any) -> torch.Tensor:  # type: ignore[override]
        """q ``[B, Tq, E]``, k/v ``[B, Tk, E]`` -> ``[B, Tq, E]``."""
        b, tq, e = q.shape
        require(e == self.dim_model, f"inputs carry {e} features, expected dim_model={self.dim_model}")
        q, k, v = self.in_proj_container(query=q, key=k, value=v)
        h = self.num_heads
        q, k, v = (t.view(b, t.shape[1], h, e // h).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        out = self.mechanism(q, k, v, self.brickwork_mask(q, k, att_mask, None))  # (B, H, Tq, D)
        return self.out_proj(out.transpose(1, 2).reshape(b, tq, e))
