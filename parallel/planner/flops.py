"""FLOPs of a training step from the spec's numbers.

Per token, a layer's forward does ``2 × (its matmul parameters)`` (an MoE layer counts the experts a
token is routed to) plus attention's two activation-by-activation matmuls, ``QKᵀ`` and ``softmax·V``:
``2 × 2 × s × a × d`` over the layer's own ``s`` tokens a row, and for the cross-attention of an
encoder-decoder's decoder layer ``2 × 2 × S × a × d`` over the encoder's ``S`` outputs (lengths.py:
a decoder layer runs the target's tokens, an encoder layer the source's). The head adds ``2 ×`` its
matmul parameters (``2 × h × V`` for an LM head) per token it reads: every token of the target (an
encoder-decoder's decoder output; every other model's one sequence), or one per sequence for an
image classifier. Backward does twice the forward, and full recomputation one more forward of the
layers.

Two counts are kept apart: ``executed`` halves causal self-attention (SDPA skips the masked blocks),
as the stage balancer does (parallel/balance.py); ``reported`` counts the whole ``s × s`` square, as
Narayanan et al. 2021 (appendix, eq. 3: ``96·B·s·l·h²·(1 + s/6h + V/16lh)``) do, so that TFLOP/s
figures compare with theirs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from brickwork.parallel.planner.lengths import Lengths
from brickwork.parallel.planner.model_facts import LayerShape, ModelFacts


@dataclass(frozen=True)
class Flops:
    """FLOPs per token: forward of the layer(s), and the attention share of it."""

    matmul: float
    attention_executed: float
    attention_reported: float

    @property
    def executed(self) -> float:
        return self.matmul + self.attention_executed

    @property
    def reported(self) -> float:
        return self.matmul + self.attention_reported


@lru_cache(maxsize=4096)
def layer_flops(shape: LayerShape, lengths: Lengths) -> Flops:
    """Forward FLOPs of one layer per token of its own sequence (``lengths.of(shape)``). A decoder
    layer's cross-attention projects its keys and values from the source's tokens, not its own."""
    own = lengths.of(shape)
    one = 4.0 * own * shape.num_heads * shape.dim_head
    executed = one * 0.5 if shape.causal and shape.sdpa else one
    cross = 4.0 * lengths.source * shape.num_heads * shape.dim_head if shape.cross_attention else 0.0
    cross_kv = 2 * shape.dim_model * shape.num_kv_heads * shape.dim_head if shape.cross_attention else 0
    matmul = 2.0 * (shape.matmul_params - cross_kv) + 2.0 * cross_kv * lengths.source / own
    return Flops(matmul, executed + cross, one + cross)


def head_flops(facts: ModelFacts, lengths: Lengths) -> float:
    """Forward FLOPs of the head per token of the target (an image classifier's spread over its
    sequence)."""
    per_read = 2.0 * facts.head_params
    return per_read / lengths.target if facts.pooled_head else per_read


def passes(recompute: str) -> float:
    """Forward-pass equivalents per step of the layers: forward, backward (2×), and full recompute."""
    return 4.0 if recompute == "full" else 3.0


def step_flops(
    facts: ModelFacts, rows: int, lengths: Lengths, recompute: str, reported: bool = True
) -> float:
    """All FLOPs of a step over ``rows`` sequences (the whole global batch, every device together)."""
    head = head_flops(facts, lengths) * lengths.target * 3.0
    return rows * (_layers_flops(facts, lengths, reported) * passes(recompute) + head)


@lru_cache(maxsize=1024)
def _layers_flops(facts: ModelFacts, lengths: Lengths, reported: bool) -> float:
    """Forward FLOPs of all the layers per row."""
    total = 0.0
    for shape in facts.layers:
        flops = layer_flops(shape, lengths)
        total += (flops.reported if reported else flops.executed) * lengths.of(shape)
    return total


@lru_cache(maxsize=4096)
def layer_matmuls(shape: LayerShape, t: int) -> tuple[tuple[float, float], ...]:
    """(output elements per token, weight elements) of each weight matmul of one layer on a TP rank of
    ``t``, in the order a Llama block runs them: per attention q, k, v and the output projection
    (whose output is the whole width: its partial sums, before they are reduced), then the
    feedforward's gate, up and down (a GLU; an MLP's up and down; a mixture of experts' routed copies
    through their experts' MLPs, ``top_k`` of them). torchtitan's per-op selective recomputation
    keeps the 1st, 3rd, 5th ... of them and recomputes the others (``meta[mm_count] % 2 == 0``,
    counted per layer): in a Llama block k, the output projection and up
    (activations.recomputed_matmuls)."""
    h, a, k, d, f = shape.dim_model, shape.num_heads, shape.num_kv_heads, shape.dim_head, shape.hidden_dim
    attention = [(a * d / t, h * a * d / t), (k * d / t, h * k * d / t), (k * d / t, h * k * d / t)]
    attention.append((h, a * d * h / t))
    up = (f / t, h * f / t)
    down = (h, f * h / t)
    feedforward = [up, up, down] if shape.feedforward == "glu" else [up, down]
    if shape.feedforward == "moe":  # each routed copy of a token runs its expert's MLP
        feedforward = [(w * shape.top_k, p * shape.top_k) for w, p in feedforward]
    return tuple(attention * shape.attentions + feedforward)


def feedforward_start(shape: LayerShape) -> int:
    """The index in :func:`layer_matmuls` of the feedforward's first matmul: each attention runs four
    before it (q, k, v and the output projection)."""
    return 4 * shape.attentions
