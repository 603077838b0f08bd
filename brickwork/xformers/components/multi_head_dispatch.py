"""xformers' ``MultiHeadDispatch``: projections, heads, optional rotary embedding and output projection
around an xformers-style mechanism (see ``brickwork.xformers.components.attention``)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch
from torch import nn

from brickwork.xformers._compat import require
from brickwork.xformers.components.attention import Attention
from brickwork.xformers.components.input_projection import InputProjection, InputProjectionConfig
from brickwork.xformers.components.positional_embedding.rotary import RotaryEmbedding
from brickwork.xformers.utils import FromConfig

logger = logging.getLogger("brickwork.xformers")


@dataclasses.dataclass
class MultiHeadDispatchConfig:
    dim_model: int
    num_heads: int
    attention: Attention
    bias: bool
    residual_dropout: float
    dim_key: int | None
    dim_value: int | None
    in_proj_container: InputProjection | None
    use_separate_proj_weight: bool | None
    use_rotary_embeddings: bool | None
    out_proj: nn.Module | None

    def __getitem__(self, item: str) -> Any:
        return getattr(self, item)


class MultiHeadDispatch(FromConfig, nn.Module):
    """``forward(query, key=None, value=None, att_mask=None, key_padding_mask=None)``: ``[B, T, E]`` in
    and out. Heads are folded into the batch (``[B*H, T, D]``) for the mechanism unless it
    ``requires_head_dimension``; a mechanism that ``requires_skip_multi_head`` gets the raw inputs."""

    def __init__(
        self,
        dim_model: int,
        num_heads: int,
        attention: Attention,
        bias: tuple[bool, bool, bool, bool] | bool = (True, True, True, True),
        residual_dropout: float = 0.0,
        use_separate_proj_weight: bool = True,
        dim_key: int | None = None,
        dim_value: int | None = None,
        in_proj_container: InputProjection | None = None,
        use_rotary_embeddings: bool | None = False,
        out_proj: nn.Module | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if isinstance(bias, bool):
            bias = (bias,) * 4
        require(num_heads > 0, f"num_heads must be positive, got {num_heads}")
        require(
            dim_model % num_heads == 0, f"dim_model={dim_model} is not divisible by num_heads={num_heads}"
        )
        dim_key, dim_value = dim_key or dim_model, dim_value or dim_model
        self.num_heads, self.dim_model = num_heads, dim_model
        self.dim_key_head, self.dim_value_head = dim_key // num_heads, dim_value // num_heads
        self.attention = attention
        if attention.requires_input_projection:
            self.in_proj_container = in_proj_container or InputProjection(
                InputProjectionConfig(dim_model, dim_key, bias=bias[0]),
                InputProjectionConfig(dim_model, dim_key, bias=bias[1]),
                InputProjectionConfig(dim_model, dim_value, bias=bias[2]),
                use_separate_proj_weight=use_separate_proj_weight,
            )
        self.rotary_embeddings = RotaryEmbedding(self.dim_key_head) if use_rotary_embeddings else None
        self.resid_drop = nn.Dropout(residual_dropout)
        self.proj = out_proj if out_proj else nn.Linear(dim_model, dim_model, bias=bias[3])
        if isinstance(self.proj, nn.Linear) and self.proj.bias is not None:
            nn.init.zeros_(self.proj.bias)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        att_mask: Any = None,
        key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """query ``[B, Tq, E]``, key/value ``[B, Tk, E]`` (default: query) -> ``[B, Tq, E]``."""
        key = query if key is None else key
        value = query if value is None else value
        if not query.shape[0] == key.shape[0] == value.shape[0]:
            batch = max(query.shape[0], key.shape[0], value.shape[0])
            query, key, value = (t.expand(batch, -1, -1) for t in (query, key, value))
        b, s_q, _ = query.shape
        s_k = key.shape[1]
        if s_q != s_k:
            require(
                not self.attention.requires_same_k_q_dimensions,
                "This attention mechanism requires query and key to have the same sequence (context) lengths",
            )
            require(
                not getattr(self.attention, "causal", False),
                "Causal attention is not supported when key and query have different sequence lengths",
            )
        masks: dict[str, Any] = {}
        if att_mask is not None:
            require(self.attention.supports_attention_mask, "This attention does not support attention masks")
            masks["att_mask"] = att_mask
        if key_padding_mask is not None:
            require(
                self.attention.supports_key_padding_mask, "This attention does not support key padding masks"
            )
            masks["key_padding_mask"] = key_padding_mask
        if self.attention.requires_skip_multi_head:
            return self.attention(query, key, value, **masks)
        if self.attention.requires_input_projection:
            q, k, v = self.in_proj_container(query=query, key=key, value=value)
        else:
            q, k, v = query, key, value
        for name, t in (("projected query", q), ("projected key", k), ("projected value", v)):
            require(
                t.shape[2] % self.num_heads == 0,
                f"the {name} embeddings need to be divisible by the number of heads",
            )
        h = self.num_heads
        head_dims = ((q, self.dim_key_head), (k, self.dim_key_head), (v, self.dim_value_head))
        q, k, v = (t.view(b, t.shape[1], h, d).transpose(1, 2) for t, d in head_dims)  # (B, H, T, D)
        if self.rotary_embeddings is not None:
            q, k = self.rotary_embeddings(q=q, k=k)
        if not self.attention.requires_head_dimension:
            q, k, v = q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)  # (B*H, T, D)
        y = self.attention(q, k, v, **masks)
        y = y.reshape(b, h, s_q, self.dim_value_head).transpose(1, 2).flatten(2)  # (B, Tq, H*D)
        return self.resid_drop(self.proj(y))
