"""Memory per device of a layout, term by term (docs/parallel.md, "The memory of one device").

- **parameters, gradients, optimizer**: counted tensor by tensor as torch shards them (DTensor and
  FSDP2 split dim 0 or 1 as ``torch.chunk`` does, rank 0 taking the larger part; ZeRO-1's
  ``ZeroRedundancyOptimizer`` hands whole tensors, largest first, to the least-loaded rank), so they
  match a real run exactly. fp32 parameters, gradients and optimizer states, AdamW's step counter per
  tensor; with the master weights in the optimizer (layout.py), 16-bit parameters, fp32 gradients,
  and an fp32 master copy beside the states, which ZeRO-1 splits evenly over a flat buffer.
- **gradient copies**: a second copy of the gradients: DDP's buckets (brickwork keeps
  ``gradient_as_bucket_view`` off); under ZeRO-2/3 with several micro-batches, FSDP's whole
  gradients, accumulated without reduction until the last micro-batch
  (``set_requires_gradient_sync(False)``, parallel/state.py); or the 16-bit gradients an
  implementation adds into its fp32 buffer after each backward. A reduction that works on the fp32
  buffer in place has none.
- **compute weights**: the 16-bit weights the matmuls read: autocast's copy of every weight (cached
  from its first use in a forward until the step's backward has used it), FSDP's gathered layers
  (every layer from its forward to its backward under ZeRO-2, two at a time under ZeRO-3, every
  layer of the stage in a pipeline, whose schedule keeps them whole between micro-batches); none
  when the parameters are 16-bit already.
- **activations**: what every in-flight micro-batch keeps for backward (activations.py); a decoder
  stage of an encoder-decoder also keeps the encoder's output once per micro-batch.
- **recomputed layer**: under recomputation, one layer's whole set, rebuilt during its backward.
- **transients**: the gradient flowing into and out of a layer; the logits and their gradient on
  the last stage (one chunk of them with the fused head loss, which instead keeps the fp32 head
  weight's gradient from its forward on); under ZeRO-2/3 one layer's whole gradient before its
  reduce-scatter.
- **allowance**: 10% of the memory allocated and freed within a step, for the caching allocator's
  fragmentation; **reserved**: what the runtime takes before any tensor (the device's preset).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, fields
from functools import lru_cache

from brickwork.parallel.planner.activations import (
    embedding_activation_bytes,
    fuses_head_loss,
    head_activation_bytes,
    layer_activation_bytes,
)
from brickwork.parallel.planner.layout import Layout, StagePlacement
from brickwork.parallel.planner.lengths import Lengths
from brickwork.parallel.planner.model_facts import DECODER_START, FIRST, LAST, ModelFacts

# Share of the memory allocated and freed within a step kept back for the caching allocator's
# fragmentation: blocks freed between micro-batches are not always reusable for the next sizes.
FRAGMENTATION = 0.10
STEP_COUNTER_BYTES = {"adamw": 4, "sgd": 0}  # AdamW's scalar step per tensor (fp32)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Peak bytes on one device, by term (the module docstring says what each holds)."""

    parameters: int
    gradients: int
    optimizer: int
    gradient_copies: int
    compute_weights: int
    activations: int
    recomputed_layer: int
    transients: int
    allowance: int
    reserved: int = 0

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    def terms(self) -> dict[str, int]:
        """Each term's bytes by its name."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def stage_groups(facts: ModelFacts, placement: StagePlacement, rank: int) -> tuple[int | str, ...]:
    """The weight groups pipeline rank ``rank`` holds: its layer indices, then the places outside the
    layers it holds: ``FIRST`` on the first stage, ``LAST`` on the last, ``DECODER_START`` where an
    encoder-decoder's decoder starts (each tied weight once, wherever it sits)."""
    groups: list[int | str] = list(placement.layers(rank))
    if placement.holds_first(rank):
        groups.append(FIRST)
    if facts.decoder_start is not None and facts.decoder_start in groups:
        groups.append(DECODER_START)
    if placement.holds_last(rank):
        groups.append(LAST)
    return tuple(groups)


@lru_cache(maxsize=64)
def _layer_weight_lists(facts: ModelFacts) -> tuple[tuple, ...]:
    layers: list[list] = [[] for _ in range(facts.num_layers)]
    for w in facts.weights:
        if w.layer >= 0:
            layers[w.layer].append(w)
    return tuple(tuple(ws) for ws in layers)


@lru_cache(maxsize=65536)
def _local_sizes(
    facts: ModelFacts, group: int | frozenset[str], tp: int, ep: int, vocab_multiple: int
) -> tuple[tuple[int, int], ...]:
    """(rows on dim 0, elements per row) of each weight of ``group`` (a layer index, or a set of
    outer places: each weight sitting in one of them, once) on this TP/EP rank."""
    if isinstance(group, int):
        weights = _layer_weight_lists(facts)[group]
    else:
        weights = tuple(w for w in facts.weights if w.places & group)
    sizes = []
    for w in weights:
        shape = w.local_shape(tp, vocab_multiple, ep)
        rows = shape[0] if shape else 1
        sizes.append((rows, math.prod(shape[1:]) if len(shape) > 1 else 1))
    return tuple(sizes)


@lru_cache(maxsize=65536)
def _group_sums(
    facts: ModelFacts, group: int | frozenset[str], tp: int, ep: int, vocab_multiple: int, dp: int
) -> tuple[int, int, int]:
    """(elements, elements of rank 0's FSDP shard over ``dp``, tensors) of ``group`` on this TP/EP rank."""
    sizes = _local_sizes(facts, group, tp, ep, vocab_multiple)
    full = sum(rows * per_row for rows, per_row in sizes)
    sharded = sum(math.ceil(rows / dp) * per_row for rows, per_row in sizes)
    return full, sharded, len(sizes)


def _split(groups: tuple[int | str, ...]) -> list[int | frozenset[str]]:
    """The layer indices of ``groups``, and their outer places as one set (a tied weight once)."""
    layers: list[int | frozenset[str]] = [g for g in groups if isinstance(g, int)]
    outer = frozenset(g for g in groups if isinstance(g, str))
    return layers + ([outer] if outer else [])


@lru_cache(maxsize=4096)
def _zero1_max_share(
    facts: ModelFacts, groups: tuple[int | str, ...], tp: int, ep: int, vocab_multiple: int, dp: int
) -> tuple[int, int]:
    """(elements, tensors) of the most-loaded rank under ZeroRedundancyOptimizer's greedy partition."""
    numels = [r * n for g in _split(groups) for r, n in _local_sizes(facts, g, tp, ep, vocab_multiple)]
    heap = [(0, 0, r) for r in range(dp)]  # (elements, tensors, rank): the least-loaded rank first
    for n in sorted(numels, reverse=True):
        elements, tensors, rank = heapq.heappop(heap)
        heapq.heappush(heap, (elements + n, tensors + 1, rank))
    elements, tensors, _ = max(heap)
    return elements, tensors


@dataclass(frozen=True)
class StateBytes:
    parameters: int
    gradients: int
    optimizer: int
    local_parameters: int  # elements of this rank's TP shard before any ZeRO split
    largest_layer: int  # elements of the largest layer's TP shard (what FSDP gathers at once)


@lru_cache(maxsize=16384)
def state_bytes(facts: ModelFacts, groups: tuple[int | str, ...], layout: Layout) -> StateBytes:
    """Parameter, gradient and optimizer bytes resident on the rank holding the weight ``groups``."""
    c = layout.config
    dp, zero = layout.data_replicas, c.zero_stage
    key = (c.tensor_parallel_size, c.expert_parallel_size, c.vocab_multiple)
    parts = _split(groups)
    sums = [_group_sums(facts, g, *key, dp) for g in parts]
    full = sum(s[0] for s in sums)
    sharded = sum(s[1] for s in sums)
    tensors = sum(s[2] for s in sums)
    counter = STEP_COUNTER_BYTES[layout.optimizer]
    p, o = layout.parameter_bytes, layout.optimizer_bytes
    if zero >= 2:
        params, grads = sharded * p, sharded * 4
        optimizer = sharded * o + counter * tensors
    elif zero == 1 and dp > 1:
        params, grads = full * p, full * 4
        if layout.implementation.master_weights == "optimizer":  # one flat buffer, split evenly
            optimizer = math.ceil(full / dp) * o + counter * tensors
        else:
            elements, owned = _zero1_max_share(facts, groups, *key, dp)
            optimizer = elements * o + counter * owned
    else:
        params, grads = full * p, full * 4
        optimizer = full * o + counter * tensors
    largest = max((s[0] for g, s in zip(parts, sums, strict=True) if isinstance(g, int)), default=0)
    if c.cpu_offload:
        params = grads = optimizer = 0
    return StateBytes(params, grads, optimizer, full, largest)


def chunk_saved(
    facts: ModelFacts, layout: Layout, placement: StagePlacement, rank: int, lengths: Lengths, rows: int
) -> list[tuple[int, int]]:
    """Per chunk of pipeline rank ``rank`` (one without interleaving), in its schedule's order: (bytes
    one micro-batch of ``rows`` rows keeps for backward in the chunk's layers, the encoder output its
    decoder layers read (an encoder layer's boundary: source tokens) and the embeddings it runs (the
    source's on the first stage, the target's where the decoder starts) included; those the head
    keeps where the chunk holds it)."""
    out = []
    start_decoder = facts.decoder_start
    for start, end in placement.chunks[rank]:
        layers = range(start, end)
        saved = sum(layer_activation_bytes(facts.layers[i], layout, lengths, rows).saved for i in layers)
        if start_decoder is not None and any(i >= start_decoder for i in layers):
            saved += layer_activation_bytes(facts.layers[0], layout, lengths, rows).boundary
        if placement.holds_first(rank) and start == 0:
            saved += embedding_activation_bytes(facts, layout, lengths.source, rows)
        if start_decoder is not None and start_decoder in layers:
            saved += embedding_activation_bytes(facts, layout, lengths.target, rows)
        last = end == placement.num_layers
        out.append((saved, head_activation_bytes(facts, layout, lengths.target, rows).saved if last else 0))
    return out


def microbatch_saved(
    facts: ModelFacts, layout: Layout, placement: StagePlacement, rank: int, lengths: Lengths, rows: int
) -> tuple[int, int]:
    """(bytes one micro-batch of ``rows`` rows keeps for backward in pipeline rank ``rank``'s layers,
    the encoder output its decoder layers read included; those its head keeps)."""
    chunks = chunk_saved(facts, layout, placement, rank, lengths, rows)
    return sum(layers for layers, _ in chunks), sum(head for _, head in chunks)


def rank_memory(
    facts: ModelFacts, layout: Layout, placement: StagePlacement, rank: int, lengths: Lengths, rows: int
) -> MemoryBreakdown:
    """Peak memory of pipeline rank ``rank`` with ``rows`` rows per micro-batch."""
    c = layout.config
    state = state_bytes(facts, stage_groups(facts, placement, rank), layout)
    layers = placement.layers(rank)
    per_layer = [layer_activation_bytes(facts.layers[i], layout, lengths, rows) for i in layers]
    last = placement.holds_last(rank)
    head = head_activation_bytes(facts, layout, lengths.target, rows) if last else None
    biggest = max(per_layer, key=lambda a: a.saved, default=None)
    chunks = tuple(a + b for a, b in chunk_saved(facts, layout, placement, rank, lengths, rows))
    activations = peak_in_flight(layout, rank, chunks)
    recomputed = biggest.recomputed if biggest is not None else 0
    transients = 2 * biggest.boundary if biggest is not None else 0
    if head is not None:
        transients += head.recomputed
        if fuses_head_loss(facts, layout, rows * lengths.target):
            transients += facts.head_vocab * facts.dim_model * 4  # the fp32 head weight's gradient
    compute_bytes = layout.activation_bytes
    dp = layout.data_replicas
    compute_weights = copies = 0
    if c.zero_stage == 3 and dp > 1 and c.pipeline_parallel_size == 1:
        # Two layers whole at a time (the one computing and the one prefetched), and one layer's
        # whole gradient before its reduce-scatter.
        compute_weights = 2 * state.largest_layer * compute_bytes
        transients += state.largest_layer * 4
    elif c.zero_stage >= 2 and dp > 1:
        # reshard_after_forward=False keeps every layer whole from its forward to its backward; in a
        # pipeline, torch's schedule keeps them whole after every backward but the last
        # (set_reshard_after_backward(False)), so under ZeRO-3 too.
        compute_weights = state.local_parameters * compute_bytes
        transients += state.largest_layer * 4
    elif layout.precision != "fp32" and layout.implementation.master_weights == "parameters":
        compute_weights = state.local_parameters * 2  # autocast's 16-bit copy of each weight
    if c.zero_stage <= 1 and dp > 1 and layout.implementation.master_weights == "parameters":
        copies = state.gradients
    elif c.zero_stage >= 2 and dp > 1 and layout.microbatches > 1:
        copies = state.local_parameters * 4  # whole gradients, accumulated until the last reduce-scatter
    elif layout.implementation.half_gradients:
        copies = state.local_parameters * 2
    allowance = int(FRAGMENTATION * (activations + recomputed + transients + compute_weights))
    return MemoryBreakdown(
        state.parameters,
        state.gradients,
        state.optimizer,
        copies,
        compute_weights,
        activations,
        recomputed,
        transients,
        allowance,
    )


def peak_in_flight(layout: Layout, rank: int, chunks: tuple[int, ...]) -> int:
    """The most bytes the in-flight micro-batches of pipeline rank ``rank`` keep at once, where one
    micro-batch keeps ``chunks[k]`` bytes in its chunk k. Without a pipeline micro-batches run one
    after another; GPipe keeps all of them; 1F1B ``min(m, p - rank)``. Interleaved 1F1B (torch's
    ``ScheduleInterleaved1F1B``, as Megatron-LM's) runs ``(v - 1)·n + 2·(p - 1 - rank)`` forwards
    first, ``n = p`` micro-batches a round through chunk 0, 1, ... in turn, then one forward and one
    backward (chunks in the reverse turn) until the forwards run out: followed op by op, so that
    chunks of unequal layers are counted as they come."""
    c = layout.config
    p, v, m = c.pipeline_parallel_size, c.virtual_pipeline_size, layout.microbatches
    if p == 1:
        return chunks[0]
    if c.pipeline_schedule == "gpipe":
        return m * sum(chunks)
    if v == 1:
        return min(m, p - rank) * chunks[0]
    return _interleaved_peak(p, v, m, rank, chunks)


@lru_cache(maxsize=4096)
def _interleaved_peak(p: int, v: int, m: int, rank: int, chunks: tuple[int, ...]) -> int:
    per_round = m // max(1, m // p)
    total = m * v
    warmup = min((v - 1) * per_round + 2 * (p - 1 - rank), total)
    held = sum(chunks[(k // per_round) % v] for k in range(warmup))
    peak = held
    # The steady phase repeats every per_round * v steps, each chunk coming in and going out per_round
    # times, so its peak is reached within the first of them.
    for j in range(min(total - warmup, per_round * v)):
        held += chunks[((warmup + j) // per_round) % v]
        peak = max(peak, held)
        held -= chunks[v - 1 - (j // per_round) % v]
    return peak
