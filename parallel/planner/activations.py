"""Activation memory per micro-batch: what one layer saves for backward, after Korthikanti et al. 2022
(arXiv 2205.05198, section 4), written for the tensors brickwork's layers keep.

Korthikanti et al. count ``s·b·h·(34 + 5·a·s/h)`` bytes per layer in 16-bit with dropout and the
attention scores kept (their eq. 1), ``s·b·h·(10 + 24/t + 5·a·s/(h·t))`` under tensor parallel and
``s·b·h·(34 + 5·a·s/h)/t`` with sequence parallel. brickwork's block keeps, per token (``h`` the
width, ``a`` heads of size ``d``, ``k`` kv heads, ``f`` the feedforward width, ``t`` the TP size):

- both norms' inputs (``2h``) and their saved statistics (LayerNorm mean and rstd, RMSNorm rstd,
  fp32; the RMSNorm torch twin also keeps its normalized input); split over ``t`` under sequence
  parallel;
- both norms' outputs (``2h``), which the projections after them keep; whole on every TP rank (under
  sequence parallel the all-gathered input is what the projection keeps);
- q, k and v (``(a + 2k)·d / t``), the attention output (``a·d / t``, which the output projection
  shares) and, with SDPA, its log-sum-exp (``a / t`` fp32) instead of the ``a·s / t`` scores that a
  mechanism computing them explicitly keeps;
- the feedforward's hidden activations: ``2f / t`` for an MLP (up projection and activation
  outputs), ``4f / t`` for a GLU (gate, up, activated gate, product);
- a 1-byte mask per element for each dropout with p > 0.

Under context parallel each rank keeps its ``s / c`` tokens plus the all-gathered keys and values.
``full`` recomputation keeps only each layer's input; ``selective`` keeps the matmul and attention
outputs (brickwork's policy, parallel/activation_checkpointing.py) and recomputes the rest; either
rebuilds one layer's full set during that layer's backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from brickwork.parallel.planner.layout import Layout
from brickwork.parallel.planner.model_facts import LayerShape, ModelFacts

FP32 = 4


@dataclass(frozen=True)
class ActivationBytes:
    """Bytes per micro-batch: ``saved`` until backward, ``recomputed`` rebuilt during backward,
    ``boundary`` the tensor passed between layers (and between pipeline stages), ``everything`` the
    whole set a forward produces (what element-wise work reads and writes)."""

    saved: int
    recomputed: int
    boundary: int
    everything: int


@lru_cache(maxsize=4096)
def layer_activation_bytes(shape: LayerShape, layout: Layout, seq_len: int, rows: int) -> ActivationBytes:
    """One layer's activation bytes for a micro-batch of ``rows`` sequences of ``seq_len`` tokens."""
    c = layout.config
    t, cp = c.tensor_parallel_size, c.context_parallel_size
    rep = 1 / t if c.sequence_parallel else 1.0  # tensors sequence parallel splits
    tokens = rows * seq_len / cp
    act = layout.activation_bytes
    h, a, k, d, f = shape.dim_model, shape.num_heads, shape.num_kv_heads, shape.dim_head, shape.hidden_dim
    norm_inputs = 2 * _norm_saved(shape.norm, layout.fused_norms, h, act) * rep
    norm_outputs = 2 * h * act
    qkv = (a + 2 * k) * d / t * act
    attention_out = a * d / t * act
    if shape.fused_attention:
        # SDPA writes its output [B, T, H, D]-major, so the projection's reshaped input is a view of it.
        attention = attention_out + a / t * FP32
    else:
        # Scores after softmax, and the output projection's own copy of the reshaped output.
        attention = 2 * attention_out + a / t * seq_len * act
    if cp > 1:
        attention += 2 * k * d / t * cp * act  # the gathered keys and values of the whole sequence
    hidden = {"mlp": 2, "glu": 4, "moe": 2 * shape.top_k}[shape.feedforward] * f / t * act
    if shape.feedforward == "moe":
        hidden += shape.top_k * h * act + shape.num_experts * FP32  # routed copies, router probabilities
    masks = shape.dropouts * h * rep
    everything = norm_inputs + norm_outputs + qkv + attention + hidden + masks
    # Rotary's cos and sin tables for the positions of this micro-batch: per position, not per row.
    rotary = 2 * seq_len / cp * shape.rotary_dim * act / tokens
    everything += rotary
    layer_input = h * rep * act
    mode = c.activation_checkpointing
    if mode == "none":
        saved, recomputed = everything, 0.0
    elif mode == "full":
        saved, recomputed = layer_input, everything
    else:
        matmul_hidden = {"mlp": 1, "glu": 2, "moe": shape.top_k}[shape.feedforward] * f / t * act
        saved = layer_input + qkv + attention + matmul_hidden + 2 * h * act  # cos/sin are recomputed
        recomputed = everything
    return ActivationBytes(
        math.ceil(saved * tokens),
        math.ceil(recomputed * tokens),
        math.ceil(layer_input * tokens),
        math.ceil(everything * tokens),
    )


def _norm_saved(norm: str, fused: bool, h: int, act: int) -> float:
    """Bytes per token a norm keeps of its input: the input and fp32 statistics (LayerNorm: mean and
    rstd; RMSNorm: rstd), and for the RMSNorm torch twin also the normalized input its weight's
    gradient needs."""
    if norm == "layernorm":
        return h * act + 2 * FP32
    return (h if fused else 2 * h) * act + FP32


@lru_cache(maxsize=4096)
def head_activation_bytes(facts: ModelFacts, layout: Layout, seq_len: int, rows: int) -> ActivationBytes:
    """The final norm, the LM head and the loss on the last stage: the norm's input and output and the
    fp32 log-probabilities over this rank's vocabulary shard are saved; the logits and their
    gradient are transient."""
    c = layout.config
    t, cp = c.tensor_parallel_size, c.context_parallel_size
    rep = 1 / t if c.sequence_parallel else 1.0
    tokens = rows * seq_len / cp
    act = layout.activation_bytes
    h = facts.dim_model
    vocab = facts.vocab_size
    if t > 1 and vocab % t:
        multiple = t * c.vocab_multiple
        vocab = math.ceil(vocab / multiple) * multiple
    local_vocab = math.ceil(vocab / t)
    norm = facts.layers[-1].norm if facts.layers else "layernorm"
    saved = _norm_saved(norm, layout.fused_norms, h, act) * rep + h * act + local_vocab * FP32
    transient = local_vocab * (act + FP32)
    return ActivationBytes(
        math.ceil(saved * tokens),
        math.ceil(transient * tokens),
        math.ceil(h * act * tokens),
        math.ceil((saved + transient) * tokens),
    )
