"""What the cost model needs to know about a spec: every weight's shape and how tensor parallel splits it,
and each layer's sizes for the activation and FLOP formulas.

The spec is resolved by the factory and instantiated on torch's ``meta`` device, which records every
parameter's shape and allocates nothing, so a 1T-parameter spec is read in about a second on any
machine. How a weight splits comes from the components' own ``tp_plan()`` declarations, the same
data ``parallelize`` applies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from brickwork.errors import ConfigError

FIRST, LAYER, LAST = "first", "layer", "last"


@dataclass(frozen=True)
class Weight:
    """One parameter: its shape, where it sits, and how tensor parallel splits it.

    ``tp_dim`` is the dim TP shards (None: replicated on every TP rank); ``segments`` are packed
    parts split separately (``colwise:3``); ``vocab`` marks vocabulary rows padded when TP does not
    divide them; ``expert`` marks a weight expert parallel splits on dim 0.
    """

    name: str
    shape: tuple[int, ...]
    where: str
    layer: int = -1
    tp_dim: int | None = None
    segments: int = 1
    vocab: bool = False
    expert: bool = False

    def local_shape(self, tp: int, vocab_multiple: int = 64, ep: int = 1) -> tuple[int, ...]:
        """The shape rank 0 holds under ``tp`` (and ``ep`` for an expert weight): torch.chunk's split."""
        shape = list(self.shape)
        if self.expert and ep > 1:
            shape[0] = math.ceil(shape[0] / ep)
        if self.tp_dim is not None and tp > 1:
            size = shape[self.tp_dim]
            if self.vocab and size % tp:
                multiple = tp * vocab_multiple
                shape[self.tp_dim] = math.ceil(size / multiple) * multiple // tp
            else:
                shape[self.tp_dim] = self.segments * math.ceil(size // self.segments / tp)
        return tuple(shape)


@dataclass(frozen=True)
class LayerShape:
    """The sizes of one block that activations and FLOPs depend on."""

    dim_model: int
    num_heads: int
    num_kv_heads: int
    dim_head: int
    hidden_dim: int
    feedforward: str  # "mlp", "glu" or "moe"
    num_experts: int
    top_k: int
    norm: str  # "layernorm" or "rmsnorm"
    rotary_dim: int  # 0 without rotary embeddings
    fused_attention: bool  # SDPA: no T x T scores are kept
    causal: bool
    dropouts: int  # dropouts with p > 0 on the residual path (each keeps a 1-byte mask per element)
    matmul_params: int  # parameters that take part in a matmul for every token (experts: top_k of them)


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: the planner caches per model
class ModelFacts:
    """A spec's weights and layer shapes. ``weights`` holds each tied parameter once."""

    weights: tuple[Weight, ...]
    layers: tuple[LayerShape, ...]
    vocab_size: int
    dim_model: int
    max_seq_len: int | None
    tied: bool

    @cached_property
    def uniform_layers(self) -> bool:
        """Whether every layer has the same shape (then a stage's cost is its layer count's)."""
        return len(set(self.layers)) <= 1

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_parameters(self) -> int:
        return sum(math.prod(w.shape) for w in self.weights)


def model_facts(spec: Any) -> ModelFacts:
    """Read ``spec`` (a dict, a .yaml/.json path or a preset name) into :class:`ModelFacts`."""
    from brickwork.blocks import DecoderLM
    from brickwork.factory import build_model
    from brickwork.factory.presets import PRESETS

    if isinstance(spec, str) and spec in PRESETS:
        spec = PRESETS[spec]
    with torch.device("meta"):  # checks the spec and sizes every weight, allocating nothing
        model = build_model(spec)
    if not isinstance(model, DecoderLM):
        raise ConfigError(
            f"the planner covers decoder LMs (model: decoder_lm), got model: {model.spec['model']}", "model"
        )
    if any(isinstance(m, _reversible_types()) for m in model.modules()):
        raise ConfigError("the planner does not cover reversible layers yet", "decoder.reversible")
    return _read(model, SimpleNamespace(**model.spec))


def _reversible_types() -> tuple[type, ...]:
    from brickwork.blocks.reversible import ReversibleLayers

    return (ReversibleLayers,)


def _read(model: nn.Module, fields: Any) -> ModelFacts:
    from brickwork.parallel.tensor.plan import component_plan

    styles = {entry.path: (entry.style, entry.segments) for entry in component_plan(model)}
    weights = []
    for name, param in model.named_parameters():  # tied parameters once
        module_path, _, leaf = name.rpartition(".")
        style, segments = styles.get(module_path, ("replicate", 1))
        tp_dim = None
        if style in ("colwise", "vocab"):
            tp_dim = 0
        elif style == "rowwise" and leaf == "weight":
            tp_dim = 1
        where, layer = FIRST, -1
        if name.startswith("layers."):
            where, layer = LAYER, int(name.split(".")[1])
        elif not name.startswith(("token_embedding", "position_embedding")):
            where = LAST
        weights.append(
            Weight(
                name,
                tuple(param.shape),
                where,
                layer,
                tp_dim,
                segments or 1,
                vocab=style == "vocab" or module_path == "lm_head",
                expert=".experts." in name,
            )
        )
    layers = tuple(_layer_shape(layer, fields.dim_model) for layer in model.layers)
    return ModelFacts(
        tuple(weights),
        layers,
        fields.vocab_size,
        fields.dim_model,
        fields.max_seq_len,
        bool(getattr(model, "tie_embeddings", fields.tie_embeddings)),
    )


def _layer_shape(layer: nn.Module, dim: int) -> LayerShape:
    attention, feedforward = layer.attention, layer.feedforward
    heads = int(getattr(attention, "num_heads", 1))
    kind = (
        "moe"
        if hasattr(feedforward, "num_experts")
        else "glu"
        if hasattr(feedforward, "gate_proj")
        else "mlp"
    )
    experts = int(getattr(feedforward, "num_experts", 1))
    top_k = int(getattr(feedforward, "top_k", 1))
    params = sum(p.numel() for n, p in layer.named_parameters() if p.dim() >= 2 and ".experts." not in n)
    expert_params = sum(p.numel() for n, p in layer.named_parameters() if ".experts." in n)
    norm = layer.attention_norm
    dropouts = sum(
        1 for m in (getattr(attention, "dropout", None), getattr(feedforward, "dropout", None)) if _drops(m)
    )
    mechanism = getattr(attention, "mechanism", None)
    return LayerShape(
        dim_model=dim,
        num_heads=heads,
        num_kv_heads=int(getattr(attention, "num_kv_heads", heads) or heads),
        dim_head=int(getattr(attention, "dim_head", dim // heads)),
        hidden_dim=int(getattr(feedforward, "hidden_dim", 4 * dim)),
        feedforward=kind,
        num_experts=experts,
        top_k=top_k,
        norm="rmsnorm" if "RMS" in type(norm).__name__ else "layernorm",
        rotary_dim=int(getattr(getattr(attention, "rotary", None), "rotary_dim", 0) or 0),
        fused_attention=type(mechanism).__name__ == "ScaledDotProduct" and mechanism.backend == "sdpa",
        causal=bool(getattr(attention, "causal", True)),
        dropouts=dropouts,
        matmul_params=params + expert_params * top_k // max(experts, 1),
    )


def _drops(module: nn.Module | None) -> bool:
    return isinstance(module, nn.Dropout) and module.p > 0
