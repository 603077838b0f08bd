"""One layout on one cluster, priced: its peak memory per device, whether it fits, and its step time.

Ranks are laid out as ``parallelize`` lays them (tensor innermost, then context, data, pipeline) and
numbered node by node, so each group's link is known: NVLink when all its ranks share a node, the
network otherwise. On a mixed cluster a pipeline stage or data-parallel rank runs at the pace of
its slowest device and must fit in its smallest one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from brickwork.errors import ConfigError
from brickwork.parallel.balance import split_rows
from brickwork.parallel.config import ParallelConfig
from brickwork.parallel.planner.devices import Cluster, Device
from brickwork.parallel.planner.float8 import float8_weights
from brickwork.parallel.planner.flops import step_flops
from brickwork.parallel.planner.layout import Layout, StagePlacement, check_layout, stage_placement
from brickwork.parallel.planner.lengths import Lengths
from brickwork.parallel.planner.memory import MemoryBreakdown, rank_memory, stage_groups, state_bytes
from brickwork.parallel.planner.model_facts import ModelFacts
from brickwork.parallel.planner.step_time import (
    COLLECTIVE_BLOCKS,
    Links,
    StageCost,
    TimeBreakdown,
    data_parallel_seconds,
    offload_seconds,
    pipeline_step,
    stage_cost,
)


@dataclass(frozen=True)
class Plan:
    """A priced layout. ``dist`` is a dist dict ``parallelize`` takes; ``memory_bytes`` the peak on the
    fullest device; ``tflops_per_device`` counts FLOPs as Narayanan et al. 2021 do (recomputation
    included, the whole attention square); ``mfu`` leaves recomputation out and divides by peak.
    ``micro_batch_size`` rows per data-parallel rank go through the model at once, and without a
    pipeline ``grad_accum_steps`` of them make the step (``train.grad_accum_steps``).
    ``chosen`` holds what ``estimate`` or ``plan`` chose because the dist dict left it open
    (choices.py): ``micro_batch_size``, ``num_microbatches`` (``grad_accum_steps`` without a
    pipeline), ``pipeline_schedule`` with ``virtual_pipeline_size``, ``activation_checkpointing``.
    ``lost_because`` says why a runner-up ranks below the best."""

    dist: dict[str, Any]
    memory_bytes: int
    step_time_s: float
    tokens_per_s: float
    tflops_per_device: float
    mfu: float
    micro_batch_size: int
    grad_accum_steps: int
    fits: bool
    device_memory_bytes: int
    memory: MemoryBreakdown
    time: TimeBreakdown
    chosen: dict[str, Any] = dataclasses.field(default_factory=dict)
    lost_because: str | None = None

    @property
    def name(self) -> str:
        """``tp8 pp4 dp2 zero1 1f1b mb1 full`` and the like."""
        d = self.dist
        parts = [f"tp{d.get('tensor_parallel_size', 1)}", f"pp{d.get('pipeline_parallel_size', 1)}"]
        parts.append(f"dp{d.get('data_parallel_size', 1)}")
        for key, short in (("context_parallel_size", "cp"), ("expert_parallel_size", "ep")):
            if d.get(key, 1) > 1:
                parts.append(f"{short}{d[key]}")
        if d.get("sequence_parallel"):
            parts.append("sp")
        if d.get("zero_stage", 0):
            parts.append(f"zero{d['zero_stage']}" + ("+offload" if d.get("cpu_offload") else ""))
        if d.get("pipeline_parallel_size", 1) > 1:
            schedule = d.get("pipeline_schedule", "1f1b")
            v = d.get("virtual_pipeline_size", 1)
            parts.append(f"{schedule}(v{v})" if v > 1 else schedule)
            parts.append(f"m{d.get('num_microbatches')}")
        parts.append(f"mb{self.micro_batch_size}")
        if self.grad_accum_steps > 1:
            parts.append(f"accum{self.grad_accum_steps}")
        recompute = d.get("activation_checkpointing", "none")
        if recompute != "none":
            parts.append(f"ckpt-{recompute}")
        return " ".join(parts)


def compact_dist(config: ParallelConfig) -> dict[str, Any]:
    """The dist dict with the four sizes and every key that differs from its default."""
    sizes = ("data_parallel_size", "tensor_parallel_size", "pipeline_parallel_size", "context_parallel_size")
    out = {}
    for field in dataclasses.fields(ParallelConfig):
        value = getattr(config, field.name)
        if field.name in sizes or value != field.default:
            out[field.name] = list(value) if isinstance(value, tuple) else value
    return out


def _group(rank0: int, stride: int, size: int) -> range:
    return range(rank0, rank0 + stride * size, stride)


def _bandwidth(cluster: Cluster, ranks: range) -> float:
    devices = cluster.distinct if cluster.uniform else [cluster.devices[r] for r in ranks]
    if cluster.same_node(ranks):
        return min(d.intra_node_bandwidth for d in devices)
    return min(d.inter_node_bandwidth for d in devices)


def links_of(cluster: Cluster, c: ParallelConfig) -> Links:
    """The bus bandwidth of each group rank 0 belongs to (every group alike on a uniform cluster)."""
    t, cp, d, p = (
        c.tensor_parallel_size,
        c.context_parallel_size,
        c.data_parallel_size,
        c.pipeline_parallel_size,
    )
    ep_stride = t * cp
    return Links(
        tp=_bandwidth(cluster, _group(0, 1, t)),
        cp=_bandwidth(cluster, _group(0, t, cp)),
        dp=_bandwidth(cluster, _group(0, t, cp * d)),  # data parallel with context parallel
        pp=_bandwidth(cluster, _group(0, t * cp * d, min(p, 2))),
        ep=_bandwidth(cluster, _group(0, ep_stride, c.expert_parallel_size)),
        contention=COLLECTIVE_BLOCKS / min(d.multiprocessors for d in cluster.distinct),
    )


def _slowest(devices: list[Device], precision: str) -> Device:
    """The device of ``devices`` with the lowest rate: a group computes at its pace."""
    return min(devices, key=lambda d: (d.rate(precision), d.memory_bandwidth))


def estimate_layout(
    facts: ModelFacts, cluster: Cluster, layout: Layout, global_batch: int, lengths: Lengths
) -> Plan:
    """Price ``layout`` for ``global_batch`` sequences of ``lengths`` tokens per step."""
    c = layout.config
    check_layout(facts, layout, cluster.world_size, lengths)
    if layout.rows_per_step != global_batch:
        raise ConfigError(
            f"micro-batch {layout.micro_batch_size} × {layout.microbatches} micro-batches × "
            f"data_parallel_size {c.data_parallel_size} = {layout.rows_per_step} rows, not the global batch "
            f"{global_batch}"
        )
    p = c.pipeline_parallel_size
    weights = list(c.device_weights) if c.device_weights and p > 1 else None
    placement = stage_placement(facts, c, weights)
    ranks = representative_ranks(facts, placement) if cluster.uniform else list(range(p))
    groups = _device_groups(cluster, layout)
    memory, fits, capacity = _memory(facts, layout, placement, ranks, lengths, groups)
    links = links_of(cluster, c)
    costs = _stage_costs(facts, layout, placement, ranks, lengths, groups, links)
    time = _step_time(facts, layout, placement, ranks, costs, links)
    tokens = global_batch * lengths.source
    peak = cluster.peak_flops(layout.precision)
    executed = step_flops(facts, global_batch, lengths, c.activation_checkpointing)
    return Plan(
        dist=compact_dist(c),
        memory_bytes=memory.total,
        step_time_s=time.step,
        tokens_per_s=tokens / time.step,
        tflops_per_device=executed / time.step / cluster.world_size / 1e12,
        mfu=step_flops(facts, global_batch, lengths, "none") / time.step / peak,
        micro_batch_size=layout.micro_batch_size,
        grad_accum_steps=layout.grad_accum_steps,
        fits=fits,
        device_memory_bytes=capacity,
        memory=memory,
        time=time,
    )


@dataclass(frozen=True)
class _DeviceGroups:
    """Where a layout's work runs: the devices of each pipeline stage, and without a pipeline the
    rows and devices of each data-parallel rank (one of them, when all are alike)."""

    stages: list[list[Device]]
    rows: list[int]
    data_ranks: list[list[Device]]


def _device_groups(cluster: Cluster, layout: Layout) -> _DeviceGroups:
    c = layout.config
    t, cp, d, p = (
        c.tensor_parallel_size,
        c.context_parallel_size,
        c.data_parallel_size,
        c.pipeline_parallel_size,
    )
    per_stage = t * cp * d
    if cluster.uniform:
        stages = [[cluster.devices[0]]] * p
    else:
        stages = [list(cluster.devices[s * per_stage : (s + 1) * per_stage]) for s in range(p)]
    # Rows per data-parallel rank: split by device_weights (pipeline-free layouts) or equal.
    rows = [layout.micro_batch_size] * d
    if c.device_weights and p == 1 and d > 1:
        rows = list(split_rows(layout.micro_batch_size * d, c.device_weights, d))
    data_ranks: list[list[Device]] = []
    if p == 1:
        data_ranks = (
            [[cluster.devices[0]]] * d
            if cluster.uniform
            else [list(cluster.devices[r * t * cp : (r + 1) * t * cp]) for r in range(d)]
        )
        if cluster.uniform and len(set(rows)) == 1:
            rows, data_ranks = rows[:1], data_ranks[:1]
    return _DeviceGroups(stages, rows, data_ranks)


def _stage_costs(
    facts: ModelFacts,
    layout: Layout,
    placement: StagePlacement,
    ranks: list[int],
    lengths: Lengths,
    groups: _DeviceGroups,
    links: Links,
) -> dict[int, StageCost]:
    """Each pipeline rank's seconds per micro-batch (without a pipeline: the slowest dp rank's)."""
    costs = {}
    for s in ranks:
        if layout.config.pipeline_parallel_size == 1:
            candidates = [
                stage_cost(
                    facts, layout, placement, 0, lengths, groups.rows[r], _slowest(g, layout.precision), links
                )
                for r, g in enumerate(groups.data_ranks)
            ]
            costs[s] = max(candidates, key=lambda x: x.total)
        else:
            device = _slowest(groups.stages[s], layout.precision)
            costs[s] = stage_cost(facts, layout, placement, s, lengths, groups.rows[0], device, links)
    return costs


def _step_time(
    facts: ModelFacts,
    layout: Layout,
    placement: StagePlacement,
    ranks: list[int],
    costs: dict[int, StageCost],
    links: Links,
) -> TimeBreakdown:
    """The step: the pipeline over the stages' costs, then the data-parallel reduction, the
    parameter gathers and the offload traffic."""
    c = layout.config
    p = c.pipeline_parallel_size
    signature = {s: _signature(facts, placement, s) for s in range(p)}
    by_signature = {signature[s]: costs[s] for s in ranks}
    stage_seconds = [by_signature[signature[s]].total if s not in costs else costs[s].total for s in range(p)]
    pipeline, bubble = pipeline_step(stage_seconds, layout.microbatches, c.virtual_pipeline_size)
    local, fullest = max(
        (state_bytes(facts, stage_groups(facts, placement, s), layout).local_parameters, s) for s in ranks
    )
    slowest = max(costs.values(), key=lambda x: x.total)
    units = 1 + min(len(placement.layers(s)) for s in ranks)  # FSDP's blocks, and the rest
    float8 = _float8_gathered(facts, layout, placement.layers(fullest))
    dp_time, gather_time = data_parallel_seconds(layout, local, slowest.compute, links, units, float8)
    offload = offload_seconds(layout, local)
    m = layout.microbatches
    return TimeBreakdown(
        compute=slowest.compute * m,
        recompute=slowest.recompute * m,
        bubble=bubble,
        tensor_parallel=slowest.tensor_parallel * m,
        context_parallel=slowest.context_parallel * m,
        expert_parallel=slowest.expert_parallel * m,
        pipeline=slowest.pipeline * m,
        data_parallel=dp_time + gather_time,
        offload=offload,
        step=pipeline + dp_time + gather_time + offload,
    )


def _float8_gathered(facts: ModelFacts, layout: Layout, layers: Sequence[int]) -> float:
    """Parameters of ``layers`` FSDP gathers in float8 on a rank: their converted linears' weights
    where the implementation gathers float8 at fp8, none otherwise."""
    if layout.precision != "fp8" or not layout.implementation.float8_all_gather:
        return 0.0
    c, rule = layout.config, layout.implementation.float8_linears
    t, ep = c.tensor_parallel_size, c.expert_parallel_size
    return sum(float8_weights(facts.layers[i], rule, t, ep) for i in layers)


def _signature(facts: ModelFacts, placement: StagePlacement, rank: int) -> tuple:
    """What a pipeline rank's cost depends on: its layers (their count, when all are alike), and
    whether it holds the embeddings or the head."""
    layers = (
        tuple(end - start for start, end in placement.chunks[rank])
        if facts.uniform_layers
        else tuple(placement.layers(rank))
    )
    return layers, placement.holds_first(rank), placement.holds_last(rank)


def representative_ranks(facts: ModelFacts, placement: StagePlacement) -> list[int]:
    """The first pipeline rank of each distinct :func:`_signature`: on a uniform cluster the others
    cost no more time, and hold no more memory (they keep fewer micro-batches in flight)."""
    seen: dict[tuple, int] = {}
    for rank in range(len(placement.chunks)):
        seen.setdefault(_signature(facts, placement, rank), rank)
    return sorted(seen.values())


def _memory(
    facts: ModelFacts,
    layout: Layout,
    placement: StagePlacement,
    ranks: list[int],
    lengths: Lengths,
    groups: _DeviceGroups,
) -> tuple[MemoryBreakdown, bool, int]:
    """(the fullest device's breakdown, whether every device fits, that device's memory)."""
    p = layout.config.pipeline_parallel_size
    fullest: tuple[MemoryBreakdown, int] | None = None
    fits = True
    for s in ranks:
        for r, row in enumerate(groups.rows if p == 1 else groups.rows[:1]):
            memory = rank_memory(facts, layout, placement, s, lengths, row)
            devices = groups.data_ranks[r] if p == 1 else groups.stages[s]
            capacity = min(dev.memory_bytes for dev in devices)
            reserved = max(dev.reserved_bytes for dev in devices)
            memory = dataclasses.replace(memory, reserved=reserved)
            fits = fits and memory.total <= capacity
            if fullest is None or memory.total > fullest[0].total:
                fullest = (memory, capacity)
    assert fullest is not None
    return fullest[0], fits, fullest[1]
