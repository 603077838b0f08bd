"""The Transformer block: sublayers, their norms, and a residual style that wires them."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from brickwork.blocks.model_kind import ChoiceSpec
from brickwork.components.attention import KVCache, MultiHeadAttention
from brickwork.components.residual import NORM_REGISTRY, RESIDUAL_REGISTRY, ResidualStyle
from brickwork.errors import ConfigError
from brickwork.option_types import CheckedConfig

NormSpec = str | type | functools.partial
ResidualSpec = str | type | functools.partial | ResidualStyle


@dataclass
class BlockSpec(CheckedConfig):
    """A block's spec: ``attention`` holds the ``MultiHeadAttention`` options and its ``mechanism``."""

    attention: dict[str, Any]
    feedforward: ChoiceSpec = field(default_factory=lambda: {"name": "mlp"})
    norm: ChoiceSpec = field(default_factory=lambda: {"name": "layernorm"})
    residual: ChoiceSpec = field(default_factory=lambda: {"name": "pre"})


@dataclass
class CrossBlockSpec(BlockSpec):
    """A decoder block of an encoder-decoder: ``cross_attention`` defaults to the self-attention's keys."""

    cross_attention: dict[str, Any] | None = None


def _norm(norm: NormSpec, dim: int, path: str) -> nn.Module:
    return NORM_REGISTRY.build(norm, path, dim=dim)


def _check_cross_attention(layer: MultiHeadAttention) -> None:
    """Cross-attention projects ``memory`` to keys and values apart from the queries, so it needs a
    mechanism that takes projections, and separate q/k/v weights."""
    if not layer.mechanism.requires_input_projection:
        what = f"{type(layer.mechanism).__name__} mixes the input itself and cannot attend to memory"
        raise ConfigError(what, "cross_attention.attention")
    if layer.fused_qkv:
        raise ConfigError("cross-attention needs separate q/k/v projections: set it to false",
                          "cross_attention.fused_qkv")  # fmt: skip


class Block(nn.Module):
    """Self-attention, cross-attention over ``memory`` when built with one, then feedforward, each
    sublayer with its own norm and all wired by the residual style.

    x ``[B, T, d]``, memory ``[B, S, d]`` -> ``[B, T, d]``. Causality is the self-attention
    mechanism's own setting, so the same class is an encoder block and a decoder block.
    """

    def __init__(
        self,
        attention: MultiHeadAttention,
        feedforward: nn.Module,
        norm: NormSpec = "layernorm",
        residual: ResidualSpec = "pre",
        cross_attention: MultiHeadAttention | None = None,
    ) -> None:
        super().__init__()
        if cross_attention is not None:
            _check_cross_attention(cross_attention)
        dim = attention.dim_model
        self.attention_norm = _norm(norm, dim, "norm")
        self.attention = attention
        if cross_attention is not None:
            self.cross_attention_norm = _norm(norm, dim, "norm")
        self.cross_attention = cross_attention
        self.feedforward_norm = _norm(norm, dim, "norm")
        self.feedforward = feedforward
        self.residual = RESIDUAL_REGISTRY.build(residual, "residual")

    def tp_plan(self) -> dict[str, str]:
        """Norms shard on the sequence under sequence parallel; the sublayers declare their own plans."""
        names = ["attention_norm", "feedforward_norm"]
        if self.cross_attention is not None:
            names.append("cross_attention_norm")
        return dict.fromkeys(names, "sequence_parallel")

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        memory: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x ``[B, T, d]`` -> ``[B, T, d]``; ``positions`` [B, T] go to the self-attention's rotary hook
        (see :class:`~brickwork.components.attention.MultiHeadAttention`)."""
        self_attend = functools.partial(self.attention, attn_mask=attn_mask, cache=cache, positions=positions)
        branches: list[tuple[nn.Module, Any]] = [(self.attention_norm, self_attend)]
        if self.cross_attention is not None:
            if memory is None:
                raise ValueError("this block has cross-attention and needs `memory` [B, S, d]")
            attend = functools.partial(self.cross_attention, memory=memory, attn_mask=memory_mask)
            branches.append((self.cross_attention_norm, attend))
        elif memory is not None:
            raise ValueError("this block has no cross-attention; build it with one to pass `memory`")
        branches.append((self.feedforward_norm, self.feedforward))
        return self.residual(x, branches)


# The names the model containers and the docs use for the two roles of the one block.
EncoderBlock = Block
DecoderBlock = Block
