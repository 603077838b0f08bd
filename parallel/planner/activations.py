"""Activation memory per micro-batch: what one layer saves for backward, after Korthikanti et al. 2022
(arXiv 2205.05198, section 4), written for the tensors brickwork's layers keep on the device that
runs them.

Korthikanti et al. count ``s·b·h·(34 + 5·a·s/h)`` bytes per layer in 16-bit with dropout and the
attention scores kept (their eq. 1), ``s·b·h·(10 + 24/t + 5·a·s/(h·t))`` under tensor parallel and
``s·b·h·(34 + 5·a·s/h)/t`` with sequence parallel. brickwork's block keeps, per token (``h`` the
width, ``a`` heads of size ``d``, ``k`` kv heads, ``f`` the feedforward width, ``t`` the TP size):

- both norms' inputs (``2h``) and their saved statistics (LayerNorm mean and rstd, RMSNorm rstd,
  fp32; the RMSNorm torch twin also keeps its normalized input); split over ``t`` under sequence
  parallel;
- both norms' outputs (``2h``), which the projections after them keep; whole on every TP rank (under
  sequence parallel the all-gathered input is what the projection keeps; an implementation that
  gathers it again in backward keeps its ``1/t`` split, implementations.py);
- q, k and v (``(a + 2k)·d / t``) and the attention output (``a·d / t``, which the output projection
  shares). What attention keeps beyond them depends on the kernel, so on the device:
  a fused SDPA kernel (flash, cuDNN, memory-efficient: every GPU, and a CPU without attention
  dropout) keeps only its log-sum-exp (``a / t`` fp32); SDPA on a CPU with attention dropout runs its
  math backend, which keeps a scaled copy of q, the probabilities, the dropout mask and the dropped
  probabilities (``a·d/t + 3·a·s/t``); a mechanism that computes the scores itself (``backend:
  math``) keeps the probabilities (``a·s/t``), and with dropout a 1-byte mask and the dropped ones;
- an encoder-decoder's decoder layer does all of that again for its cross-attention, whose k and v
  come from the encoder's output (kept once per stage and micro-batch, memory.py), and whose
  probabilities, where kept, are ``S`` wide: the source's tokens (lengths.py; the layer's own
  ``s`` are the target's);
- the feedforward's hidden activations: ``2f / t`` for an MLP (up projection and activation
  outputs), ``4f / t`` for a GLU (gate, up, activated gate, product; ``3f / t`` where the GLU's
  activation keeps only its input, implementations.py);
- a mask per element for each dropout with p > 0 (after an attention's output projection, of the
  width; on the feedforward's hidden activation, of ``f / t``): 1 byte on a GPU, where it is a
  boolean, an activation's bytes on a CPU, where torch keeps it in the activation's dtype.

The first stage also keeps the embedding's: its norm's input and statistics, its dropout's mask, and
in a post-norm model the layers' input (a pre-norm model's first norm keeps it). The last stage's
head is :func:`head_activation_bytes`.

Under context parallel each rank keeps its ``s / c`` tokens plus the all-gathered keys and values
(an encoder-decoder, whose rows are two sequences, takes no context parallel).
``full`` recomputation keeps only each layer's input; ``selective`` keeps the outputs of the matmuls,
of attention and of the tensor-parallel reductions (brickwork's policy,
parallel/activation_checkpointing.py) and recomputes the rest
(or, as Korthikanti et al. section 5, recomputes the attention core only); either rebuilds one
layer's full set during that layer's backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from brickwork.kernels.linear_cross_entropy import default_chunk_size
from brickwork.parallel.planner.float8 import converted
from brickwork.parallel.planner.flops import layer_matmuls
from brickwork.parallel.planner.layout import Layout
from brickwork.parallel.planner.lengths import Lengths
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


def keeps_scores(shape: LayerShape, layout: Layout) -> bool:
    """Whether attention keeps its ``s × s`` probabilities for backward on this layout's devices."""
    return not shape.sdpa or (shape.attention_dropout and not layout.gpu_kernels)


def _attention(shape: LayerShape, layout: Layout, keys: int) -> tuple[float, float]:
    """(bytes per query one attention module over ``keys`` keys a row keeps beyond q, k, v and its
    output; of them, what a selective recomputation keeps)."""
    t, act = layout.config.tensor_parallel_size, layout.activation_bytes
    a, d = shape.num_heads, shape.dim_head
    if not keeps_scores(shape, layout):
        return a / t * FP32, a / t * FP32  # the log-sum-exp
    probabilities = a / t * keys * act
    if shape.sdpa:  # SDPA's math backend: a scaled copy of q, probabilities, mask, dropped probabilities
        kept = a * d / t * act + 3 * probabilities
        return kept, kept
    # Scores after softmax, and the output projection's own copy of the reshaped output.
    kept = a * d / t * act + probabilities
    if shape.attention_dropout:
        kept += probabilities + a / t * keys  # the dropped probabilities, and a 1-byte mask
    return kept, kept


@lru_cache(maxsize=4096)
def recomputed_matmuls(shape: LayerShape, layout: Layout) -> tuple[int, ...]:
    """The indices (flops.layer_matmuls) of the matmuls whose outputs a per-op selective recomputation
    does not keep, and so runs again: the 2nd, 4th, 6th ... it counts (``meta[mm_count] % 2 == 0``).
    At fp8, where the policy does not see float8 matmuls (``Implementation.float8_matmuls_kept``
    False: a float8 linear's matmul is ``aten._scaled_mm``, which it neither counts nor keeps), every
    converted one, and the 2nd, 4th ... of the rest. None under another policy or mode."""
    c = layout.config
    if c.activation_checkpointing != "selective" or layout.implementation.selective != "alternate_matmuls":
        return ()
    count = len(layer_matmuls(shape, 1))
    if layout.precision != "fp8" or layout.implementation.float8_matmuls_kept:
        return tuple(range(1, count, 2))
    float8 = converted(shape, layout.implementation.float8_linears)
    counted = [i for i in range(count) if not float8[i]]
    return tuple(sorted({i for i in range(count) if float8[i]} | set(counted[1::2])))


@lru_cache(maxsize=8192)
def layer_activation_bytes(shape: LayerShape, layout: Layout, lengths: Lengths, rows: int) -> ActivationBytes:
    """One layer's activation bytes for a micro-batch of ``rows`` sequences of ``lengths.of(shape)``
    tokens. An encoder-decoder's decoder layer reads encoder outputs of ``lengths.source`` tokens
    too; the encoder output itself is counted once per stage (memory.py)."""
    c = layout.config
    t, cp = c.tensor_parallel_size, c.context_parallel_size
    rep = 1 / t if c.sequence_parallel else 1.0  # tensors sequence parallel splits
    own = lengths.of(shape)
    tokens = rows * own / cp
    act = layout.activation_bytes
    h, a, k, d, f = shape.dim_model, shape.num_heads, shape.num_kv_heads, shape.dim_head, shape.hidden_dim
    n = shape.attentions
    norms = n + 1
    norm_inputs = norms * _norm_saved(shape.norm, layout.gpu_kernels, h, act) * rep
    split_outputs = not layout.implementation.gathered_norm_outputs
    norm_outputs = norms * h * act * (rep if split_outputs else 1.0)
    # Cross-attention's keys and values are the source's: S of them a row, against the layer's own.
    qkv = (n * a + 2 * k * (1 + (lengths.source / own if shape.cross_attention else 0))) * d / t * act
    attention_out = n * a * d / t * act
    extra, extra_selective = _attention(shape, layout, own)
    if shape.cross_attention:
        cross, cross_selective = _attention(shape, layout, lengths.source)
        extra, extra_selective = extra + cross, extra_selective + cross_selective
    attention = attention_out + extra
    gathered = 2 * k * d / t * cp * act  # the gathered keys and values of the whole sequence
    attention += gathered if cp > 1 else 0.0
    glu = 3 if layout.implementation.glu_keeps_input_only else 4
    hidden = {"mlp": 2, "glu": glu, "moe": 2 * shape.top_k}[shape.feedforward] * f / t * act
    if shape.feedforward == "moe":
        hidden += shape.top_k * h * act + shape.num_experts * FP32  # routed copies, router probabilities
    mask = 1 if layout.gpu_kernels else act
    masks = shape.residual_dropouts * h * rep * mask + (f / t * mask if shape.hidden_dropout else 0.0)
    everything = norm_inputs + norm_outputs + qkv + attention + hidden + masks
    # Rotary's cos and sin tables for the positions of this micro-batch: per position, not per row.
    everything += 2 * own / cp * shape.rotary_dim * act / tokens
    layer_input = h * rep * act
    mode = c.activation_checkpointing
    if mode == "none":
        saved, recomputed = everything, 0.0
    elif mode == "full":
        saved, recomputed = layer_input, everything
    elif layout.implementation.selective == "attention_core":
        # The attention core recomputed: its output and what it keeps beyond q, k and v.
        recomputed = attention - (gathered if cp > 1 else 0.0)
        saved = everything - recomputed
    else:
        dropped = recomputed_matmuls(shape, layout)
        matmuls = sum(w for i, (w, _) in enumerate(layer_matmuls(shape, t)) if i not in dropped) * act
        # The policy keeps the tensor-parallel reductions' outputs: the residual's share of each.
        reductions = (n + 1) * h * rep * act if t > 1 else 0.0
        saved = layer_input + matmuls + reductions + attention_out + extra_selective
        recomputed = everything
    return ActivationBytes(
        math.ceil(saved * tokens),
        math.ceil(recomputed * tokens),
        math.ceil(layer_input * tokens),
        math.ceil(everything * tokens),
    )


@lru_cache(maxsize=4096)
def embedding_activation_bytes(facts: ModelFacts, layout: Layout, seq_len: int, rows: int) -> int:
    """What an embedding of ``rows`` sequences of ``seq_len`` tokens keeps for a micro-batch: the first
    stage's, and an encoder-decoder's decoder embedding where its decoder starts (the module
    docstring)."""
    c = layout.config
    rep = 1 / c.tensor_parallel_size if c.sequence_parallel else 1.0
    act, h = layout.activation_bytes, facts.dim_model
    norm = facts.layers[0].norm
    per_token = _norm_saved(norm, layout.gpu_kernels, h, act) * rep if facts.embedding_norm else 0.0
    per_token += h * rep * (1 if layout.gpu_kernels else act) if facts.embedding_dropout else 0.0
    per_token += h * rep * act if facts.layers[0].post_norm else 0.0
    return math.ceil(per_token * rows * seq_len / c.context_parallel_size)


def _norm_saved(norm: str, fused: bool, h: int, act: int) -> float:
    """Bytes per token a norm keeps of its input: the input and fp32 statistics (LayerNorm: mean and
    rstd; RMSNorm: rstd), and for the RMSNorm torch twin also the normalized input its weight's
    gradient needs."""
    if norm == "layernorm":
        return h * act + 2 * FP32
    return (h if fused else 2 * h) * act + FP32


@lru_cache(maxsize=4096)
def head_activation_bytes(facts: ModelFacts, layout: Layout, seq_len: int, rows: int) -> ActivationBytes:
    """The final norm, the head and the loss on the last stage, for ``rows`` sequences of ``seq_len``
    tokens (the target's: an encoder-decoder's decoder output).

    A decoder LM's head under brickwork's causal-LM step, when it is whole on the rank (no tensor or
    pipeline parallel), is the chunked fused linear + cross-entropy (kernels/linear_cross_entropy.py):
    it keeps the final hidden states' gradient, computed in the forward pass, and one chunk of logits
    at a time. Otherwise the loss takes the logits: the norm's input and output and the fp32
    log-probabilities over this rank's columns are saved; the logits and their gradient are
    transient. A masked-LM head's dense layer, activation and norm add ``3h``; an image encoder's head
    reads one token per image, which is nothing beside the layers.
    """
    c = layout.config
    t, cp = c.tensor_parallel_size, c.context_parallel_size
    rep = 1 / t if c.sequence_parallel else 1.0
    tokens = rows * seq_len / cp
    act = layout.activation_bytes
    h = facts.dim_model
    if facts.pooled_head:
        return ActivationBytes(0, 0, math.ceil(h * act * tokens), 0)
    vocab = facts.head_vocab
    if facts.head_split and t > 1 and vocab % t:
        multiple = t * c.vocab_multiple
        vocab = math.ceil(vocab / multiple) * multiple
    local_vocab = math.ceil(vocab / t) if facts.head_split else vocab
    # The final norm's input and statistics, and its output, which the head keeps as its input.
    norm = (_norm_saved(facts.layers[-1].norm, layout.gpu_kernels, h, act) * rep + h * act) * facts.final_norm
    dense = max(facts.head_params - facts.head_vocab * h, 0) / (h * h) * (3 * h * act + 2 * FP32)
    if fuses_head_loss(facts, layout, rows * seq_len):
        saved = norm + h * act + dense  # the hidden states' gradient
        transient = 0.0
    else:
        saved = norm + dense + local_vocab * FP32
        transient = local_vocab * (act + FP32)
    return ActivationBytes(
        math.ceil(saved * tokens),
        math.ceil(transient * tokens),
        math.ceil(h * act * tokens),
        math.ceil((saved + transient) * tokens),
    )


def fuses_head_loss(facts: ModelFacts, layout: Layout, tokens: int) -> bool:
    """Whether the loss over ``tokens`` tokens is brickwork's chunked fused head: a decoder LM whose
    head weight is whole on the rank (no tensor parallel) and part of the model the step calls (no
    pipeline), unless its torch path (a CPU) takes the plain loss, as it does for fp32 logits that fit
    one chunk (kernels/linear_cross_entropy.py)."""
    c = layout.config
    whole = c.tensor_parallel_size == 1 and c.pipeline_parallel_size == 1
    if not (facts.causal_lm and whole and layout.implementation.fused_head_loss):
        return False
    plain = not layout.gpu_kernels and layout.precision == "fp32"
    return not (plain and default_chunk_size(tokens, facts.head_vocab) >= tokens)
