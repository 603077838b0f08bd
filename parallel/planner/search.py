"""The planner: every valid layout for a spec on a cluster, priced, the ones that fit ranked by step time.

A layout is a choice of tensor, context, pipeline, data and expert parallel sizes, ZeRO stage,
pipeline schedule and virtual stages, micro-batch size and recomputation. Sizes must divide what
they split (heads, kv heads, the feedforward width, experts, the sequence, the global batch) and
every stage needs a layer. Sequence parallel is on whenever tensor parallel is (it saves activation
memory for the same communication). Context parallel is tried for sequences of 8192 tokens and more,
where it is the tool; ZeRO-2/3 are tried without a pipeline, where FSDP's per-micro-batch gathers do
not multiply by the pipeline's micro-batches. On a mixed cluster, a pipeline without data parallel
gets ``device_weights`` per stage and a data-parallel layout without a pipeline per rank, from each
device's achievable rate, as Whale balances work over heterogeneous GPUs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from brickwork.errors import ConfigError
from brickwork.parallel.config import ParallelConfig
from brickwork.parallel.planner.devices import Cluster
from brickwork.parallel.planner.estimate import Plan, check_layout, estimate_layout
from brickwork.parallel.planner.layout import Layout, planned_config
from brickwork.parallel.planner.model_facts import ModelFacts

MICRO_BATCH_SIZES = (1, 2, 4, 8, 16, 32)
RECOMPUTE = ("none", "selective", "full")
VIRTUAL_STAGES = (2, 4, 8)
LONG_SEQUENCE = 8192


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _weights(cluster: Cluster, config: ParallelConfig, precision: str) -> tuple[float, ...] | None:
    """Whale-style device weights for a mixed cluster: each stage's (or dp rank's) slowest rate."""
    if cluster.uniform:
        return None
    t, cp, d, p = (
        config.tensor_parallel_size,
        config.context_parallel_size,
        config.data_parallel_size,
        config.pipeline_parallel_size,
    )
    if p > 1 and d == 1:
        size = t * cp
        groups = [cluster.devices[s * size : (s + 1) * size] for s in range(p)]
    elif p == 1 and d > 1:
        size = t * cp
        groups = [cluster.devices[r * size : (r + 1) * size] for r in range(d)]
    else:
        return None
    rates = [min(dev.rate(precision) for dev in group) for group in groups]
    top = max(rates)
    return tuple(round(r / top, 4) for r in rates)


def candidate_layouts(
    facts: ModelFacts, cluster: Cluster, global_batch: int, seq_len: int, options: dict[str, Any]
) -> Iterator[Layout]:
    """Every layout of the search space that passes the divisibility rules."""
    world = cluster.world_size
    shape = facts.layers[0]
    precision, optimizer = options["precision"], options["optimizer"]
    fixed_accum = options.get("grad_accum_steps")
    fused_norms = all(device.triton_kernels for device in cluster.devices)
    for t in divisors(world):
        if shape.num_heads % t or shape.num_kv_heads % t or shape.hidden_dim % t:
            continue
        for cp in divisors(world // t):
            if cp > 1 and (seq_len < LONG_SEQUENCE or seq_len % cp):
                continue
            for p in divisors(world // (t * cp)):
                if p > facts.num_layers:
                    continue
                d = world // (t * cp * p)
                if global_batch % d:
                    continue
                experts = [1]
                if shape.feedforward == "moe" and p == 1 and cp == 1:
                    experts = [e for e in divisors(d) if shape.num_experts % e == 0]
                for ep in experts:
                    yield from _layouts_for_sizes(
                        facts, t, cp, p, d, ep, global_batch, (precision, optimizer, fused_norms), fixed_accum
                    )


def _layouts_for_sizes(
    facts: ModelFacts,
    t: int,
    cp: int,
    p: int,
    d: int,
    ep: int,
    global_batch: int,
    step_options: tuple[str, str, bool],
    fixed_accum: int | None,
) -> Iterator[Layout]:
    precision, optimizer, fused_norms = step_options
    rows = global_batch // d
    zero_stages = (0,) if d == 1 else (0, 1, 2, 3) if p == 1 else (0, 1)
    for b in MICRO_BATCH_SIZES:
        if rows % b:
            continue
        m = rows // b
        if p == 1 and fixed_accum is not None and m != fixed_accum:
            continue
        schedules: list[tuple[str, int]] = [("1f1b", 1)]
        if p > 1:
            if m < p:
                continue
            schedules = [("1f1b", 1), ("gpipe", 1)]
            schedules += [
                ("interleaved_1f1b", v) for v in VIRTUAL_STAGES if facts.num_layers >= p * v and m % p == 0
            ]
        for zero in zero_stages:
            for schedule, v in schedules:
                for recompute in RECOMPUTE:
                    config = planned_config(
                        dict(
                            data_parallel_size=d,
                            tensor_parallel_size=t,
                            pipeline_parallel_size=p,
                            context_parallel_size=cp,
                            expert_parallel_size=ep,
                            sequence_parallel=t > 1,
                            zero_stage=zero,
                            activation_checkpointing=recompute,
                            num_microbatches=m if p > 1 else None,
                            pipeline_schedule=schedule,
                            virtual_pipeline_size=v,
                        )
                    )
                    yield Layout(config, b, 1 if p > 1 else m, precision, optimizer, fused_norms)


def search(
    facts: ModelFacts, cluster: Cluster, global_batch: int, seq_len: int, options: dict[str, Any]
) -> tuple[list[Plan], list[Plan]]:
    """(the layouts that fit, best first, each runner-up saying why it lost; those that do not fit)."""
    feasible, infeasible = [], []
    for layout in candidate_layouts(facts, cluster, global_batch, seq_len, options):
        weights = _weights(cluster, layout.config, layout.precision)
        if weights is not None:
            layout = Layout(
                _with(layout.config, device_weights=weights),
                layout.micro_batch_size,
                layout.grad_accum_steps,
                layout.precision,
                layout.optimizer,
                layout.fused_norms,
            )
        try:
            check_layout(facts, layout, cluster.world_size, seq_len)
        except ConfigError:
            continue
        plan = estimate_layout(facts, cluster, layout, global_batch, seq_len)
        (feasible if plan.fits else infeasible).append(plan)
    feasible.sort(key=lambda p: (p.step_time_s, p.memory_bytes))
    if feasible:
        best = feasible[0]
        feasible = [best] + [_with_reason(p, best) for p in feasible[1:]]
    infeasible.sort(key=lambda p: p.memory_bytes / p.device_memory_bytes)
    return feasible, infeasible


def _with(config: ParallelConfig, **changes: Any) -> ParallelConfig:
    import dataclasses

    return dataclasses.replace(config, **changes)


def _with_reason(plan: Plan, best: Plan) -> Plan:
    import dataclasses

    return dataclasses.replace(plan, lost_because=why_slower(plan, best))


def why_slower(plan: Plan, best: Plan) -> str:
    """The main cause of ``plan``'s longer step than ``best``'s: compute, recomputation, the bubble or
    a kind of communication, with the seconds it adds."""
    a, b = plan.time, best.time
    causes = {
        "recomputation": a.recompute - b.recompute,
        "compute": (a.compute - a.recompute) - (b.compute - b.recompute),
        "pipeline bubble": a.bubble - b.bubble,
        "tensor-parallel communication": a.tensor_parallel - b.tensor_parallel,
        "context-parallel communication": a.context_parallel - b.context_parallel,
        "expert-parallel communication": a.expert_parallel - b.expert_parallel,
        "pipeline sends": a.pipeline - b.pipeline,
        "data-parallel communication": a.data_parallel - b.data_parallel,
        "cpu offload copies": a.offload - b.offload,
    }
    cause, seconds = max(causes.items(), key=lambda kv: kv[1])
    slower = plan.step_time_s / best.step_time_s - 1
    if seconds <= 0:
        return f"{slower:.1%} slower"
    return f"{slower:.1%} slower: {cause} +{_seconds(seconds)}"


def _seconds(value: float) -> str:
    return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.2f} s"
