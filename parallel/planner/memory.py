"""Memory per device of a layout: weights, gradients and optimizer state under each ZeRO stage, the
activations every in-flight micro-batch keeps, transient buffers, and an allowance for fragmentation.

Parameters, gradients and optimizer state are counted tensor by tensor as torch shards them (DTensor
and FSDP2 split dim 0 or 1 as ``torch.chunk`` does, rank 0 taking the larger part; ZeRO-1's
``ZeroRedundancyOptimizer`` hands whole tensors, largest first, to the least-loaded rank), so they
match a real run exactly. Activations follow Korthikanti et al. 2022 (arXiv 2205.05198, section 4),
written for what brickwork's layers save (``activations.py``).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import lru_cache

from brickwork.parallel.planner.activations import head_activation_bytes, layer_activation_bytes
from brickwork.parallel.planner.layout import Layout, StagePlacement
from brickwork.parallel.planner.model_facts import FIRST, LAST, LAYER, ModelFacts, Weight

TIED = "tied"  # the last stage's copy of a tied embedding

# Share of the dynamic bytes (activations and buffers) kept back for the caching allocator's
# fragmentation: blocks freed between micro-batches are not always reusable for the next sizes.
FRAGMENTATION = 0.10
# Optimizer states per parameter element, and AdamW's scalar step counter per tensor (fp32).
OPTIMIZER_STATES = {"adamw": 2, "sgd": 1}
STEP_COUNTER_BYTES = {"adamw": 4, "sgd": 0}


@dataclass(frozen=True)
class MemoryBreakdown:
    """Peak bytes on one device, by kind."""

    parameters: int
    gradients: int
    optimizer: int
    activations: int
    buffers: int
    allowance: int
    reserved: int = 0

    @property
    def total(self) -> int:
        return (
            self.parameters
            + self.gradients
            + self.optimizer
            + self.activations
            + self.buffers
            + self.allowance
            + self.reserved
        )


def stage_groups(facts: ModelFacts, placement: StagePlacement, rank: int) -> tuple[int | str, ...]:
    """The weight groups pipeline rank ``rank`` holds: its layer indices, ``FIRST`` (embeddings) on the
    first stage, ``LAST`` (final norm, head) on the last, and there a copy of a tied embedding."""
    groups: list[int | str] = list(placement.layers(rank))
    if placement.holds_first(rank):
        groups.append(FIRST)
    if placement.holds_last(rank):
        groups.append(LAST)
        if facts.tied and not placement.holds_first(rank):
            groups.append(TIED)
    return tuple(groups)


@lru_cache(maxsize=64)
def _group_weights(facts: ModelFacts) -> dict[int | str, list[Weight]]:
    groups: dict[int | str, list[Weight]] = {i: [] for i in range(facts.num_layers)}
    groups[FIRST], groups[LAST], groups[TIED] = [], [], []
    for w in facts.weights:
        groups[w.layer if w.where == LAYER else w.where].append(w)
        if w.name == "token_embedding.weight":
            groups[TIED].append(w)
    return groups


@lru_cache(maxsize=65536)
def _local_sizes(
    facts: ModelFacts, group: int | str, tp: int, ep: int, vocab_multiple: int
) -> tuple[tuple[int, int], ...]:
    """(rows on dim 0, elements per row) of each weight of ``group`` on this TP/EP rank."""
    sizes = []
    for w in _group_weights(facts)[group]:
        shape = w.local_shape(tp, vocab_multiple, ep)
        rows = shape[0] if shape else 1
        sizes.append((rows, math.prod(shape[1:]) if len(shape) > 1 else 1))
    return tuple(sizes)


@lru_cache(maxsize=65536)
def _group_sums(
    facts: ModelFacts, group: int | str, tp: int, ep: int, vocab_multiple: int, dp: int
) -> tuple[int, int, int]:
    """(elements, elements of rank 0's FSDP shard over ``dp``, tensors) of ``group`` on this TP/EP rank."""
    sizes = _local_sizes(facts, group, tp, ep, vocab_multiple)
    full = sum(rows * per_row for rows, per_row in sizes)
    sharded = sum(math.ceil(rows / dp) * per_row for rows, per_row in sizes)
    return full, sharded, len(sizes)


@lru_cache(maxsize=4096)
def _zero1_max_share(
    facts: ModelFacts, groups: tuple[int | str, ...], tp: int, ep: int, vocab_multiple: int, dp: int
) -> tuple[int, int]:
    """(elements, tensors) of the most-loaded rank under ZeroRedundancyOptimizer's greedy partition."""
    numels = [r * n for g in groups for r, n in _local_sizes(facts, g, tp, ep, vocab_multiple)]
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


def state_bytes(facts: ModelFacts, groups: tuple[int | str, ...], layout: Layout) -> StateBytes:
    """Parameter, gradient and optimizer bytes resident on the rank holding the weight ``groups``."""
    c = layout.config
    dp, zero = c.data_parallel_size, c.zero_stage
    key = (c.tensor_parallel_size, c.expert_parallel_size, c.vocab_multiple)
    sums = [_group_sums(facts, g, *key, dp) for g in groups]
    full = sum(s[0] for s in sums)
    sharded = sum(s[1] for s in sums)
    tensors = sum(s[2] for s in sums)
    states, counter = OPTIMIZER_STATES[layout.optimizer], STEP_COUNTER_BYTES[layout.optimizer]
    b = layout.master_bytes
    if zero >= 2:
        params = grads = sharded * b
        optimizer = sharded * b * states + counter * tensors
    elif zero == 1 and dp > 1:
        params = grads = full * b
        elements, owned = _zero1_max_share(facts, groups, *key, dp)
        optimizer = elements * b * states + counter * owned
    else:
        params = grads = full * b
        optimizer = full * b * states + counter * tensors
    largest = max((s[0] for g, s in zip(groups, sums, strict=True) if isinstance(g, int)), default=0)
    if c.cpu_offload:
        params = grads = optimizer = 0
    return StateBytes(params, grads, optimizer, full, largest)


def rank_memory(
    facts: ModelFacts, layout: Layout, placement: StagePlacement, rank: int, seq_len: int, rows: int
) -> MemoryBreakdown:
    """Peak memory of pipeline rank ``rank`` with ``rows`` rows per micro-batch."""
    c = layout.config
    state = state_bytes(facts, stage_groups(facts, placement, rank), layout)
    layers = placement.layers(rank)
    per_layer = [layer_activation_bytes(facts.layers[i], layout, seq_len, rows) for i in layers]
    last = placement.holds_last(rank)
    head = head_activation_bytes(facts, layout, seq_len, rows) if last else None
    chunk_layers = max(len(range(s, e)) for s, e in placement.chunks[rank])
    biggest = max(per_layer, key=lambda a: a.saved, default=None)
    # Each in-flight micro-batch keeps what its chunk saved; with v chunks a rank's in-flight count
    # is counted in chunk-micro-batches (interleaved_1f1b's warm-up), each holding one chunk's layers.
    in_flight = in_flight_chunks(layout, rank)
    stage_saved = sum(a.saved for a in per_layer)
    if c.virtual_pipeline_size > 1:
        saved_per_chunk = stage_saved * chunk_layers / max(len(layers), 1)
        activations = int(saved_per_chunk * in_flight)
    else:
        activations = stage_saved * in_flight
    if head is not None:
        activations += head.saved * min(in_flight, layout.microbatches)
    buffers = 0
    if biggest is not None:
        buffers += biggest.recomputed  # the one layer rebuilt during its backward
        buffers += biggest.boundary * 2  # the gradient flowing in and out of a layer
    if head is not None:
        buffers += head.recomputed
    compute_bytes = 4 if layout.precision == "fp32" else 2
    dp = c.data_parallel_size
    if c.zero_stage == 3 and dp > 1:
        # Two layers unsharded at a time (the one computing and the one prefetched), plus one
        # layer's unsharded gradient before its reduce-scatter.
        buffers += state.largest_layer * (2 * compute_bytes + layout.master_bytes)
    elif c.zero_stage == 2 and dp > 1:
        # reshard_after_forward=False keeps every layer unsharded from its forward to its backward.
        buffers += state.local_parameters * compute_bytes + state.largest_layer * layout.master_bytes
    elif layout.precision != "fp32" and layout.precision != "bf16":
        buffers += state.local_parameters * 2  # autocast's low-precision copy of each weight
    if c.zero_stage <= 1 and dp > 1:
        buffers += state.gradients  # DDP's gradient buckets (gradient_as_bucket_view is off)
    allowance = int(FRAGMENTATION * (activations + buffers))
    return MemoryBreakdown(
        state.parameters, state.gradients, state.optimizer, activations, buffers, allowance
    )


def in_flight_chunks(layout: Layout, rank: int) -> int:
    """Micro-batches (chunk-micro-batches when interleaved) whose activations rank ``rank`` holds at once."""
    c = layout.config
    p, v, m = c.pipeline_parallel_size, c.virtual_pipeline_size, layout.microbatches
    if p == 1:
        return 1  # micro-batches accumulate one after another
    if c.pipeline_schedule == "gpipe":
        return m
    if c.pipeline_schedule == "1f1b":
        return min(m, p - rank)
    return min(m * v, 2 * (p - rank - 1) + (v - 1) * p + 1)
