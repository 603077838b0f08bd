"""The planner: every valid layout for a spec on a cluster, the ones that fit ranked by step time.

A layout is a choice of tensor, context, pipeline, data and expert parallel sizes and ZeRO stage,
then of what choices.py enumerates (micro-batch size and count, pipeline schedule and virtual stages,
recomputation). Sizes must divide what they split (heads, kv heads, the feedforward width, experts,
the sequence, the global batch) and every stage needs a layer. Sequence parallel is on whenever
tensor parallel is (it saves activation memory for the same communication). Context parallel is
tried for sequences of 8192 tokens and more, where it is the tool; ZeRO-2/3 wherever the
implementation has FSDP, but ZeRO-3 not in a pipeline, where torch's schedule keeps a stage's
parameters whole between micro-batches (memory.py) and ZeRO-3 only adds gathers to ZeRO-2. On a
mixed cluster, a pipeline without data parallel gets ``device_weights`` per stage and a data-parallel
layout without a pipeline per rank, from each device's achievable rate, as Whale balances work over
heterogeneous GPUs.

Every layout is considered; bounds decide which are priced in full:

- **memory**: a choice of sizes whose parameters, gradients and optimizer state alone, under the
  most sharding its ZeRO stages offer, overflow a device fits with no micro-batch size, schedule or
  recomputation; and a micro-batch that does not fit rules out the larger ones of the same ZeRO
  stage, schedule and recomputation (activations only grow with it).
- **time**: a choice of sizes takes at least its slowest-on-average pipeline rank's work for the
  whole batch (compute, element-wise traffic and tensor- and context-parallel communication at one
  micro-batch, no recomputation, no bubble, no data-parallel traffic). Sizes are priced in the order
  of that bound, and once it exceeds ``KEEP_WITHIN`` times the fastest step found, no later layout
  can be listed: the search stops.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

from brickwork.errors import ConfigError
from brickwork.parallel.config import ParallelConfig
from brickwork.parallel.planner.choices import ALL_OPEN, candidates, chosen_values, divisors
from brickwork.parallel.planner.devices import Cluster
from brickwork.parallel.planner.estimate import (
    Plan,
    estimate_layout,
    links_of,
    representative_ranks,
)
from brickwork.parallel.planner.layout import Layout, check_layout, planned_config, stage_placement
from brickwork.parallel.planner.lengths import Lengths
from brickwork.parallel.planner.memory import stage_groups, state_bytes
from brickwork.parallel.planner.model_facts import ModelFacts
from brickwork.parallel.planner.step_time import stage_cost

LONG_SEQUENCE = 8192
# plan() lists the layouts that fit within this factor of the fastest step; slower ones are bounded out.
KEEP_WITHIN = 1.5


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
        groups = [cluster.devices[s * t * cp : (s + 1) * t * cp] for s in range(p)]
    elif p == 1 and d > 1:
        groups = [cluster.devices[r * t * cp : (r + 1) * t * cp] for r in range(d)]
    else:
        return None
    rates = [min(dev.rate(precision) for dev in group) for group in groups]
    top = max(rates)
    return tuple(round(r / top, 4) for r in rates)


def size_configs(
    facts: ModelFacts, cluster: Cluster, global_batch: int, lengths: Lengths, step: dict[str, Any]
) -> Iterator[list[ParallelConfig]]:
    """For each choice of sizes that passes the divisibility rules, its configs, one per ZeRO stage."""
    world = cluster.world_size
    shape = facts.layers[0]
    # Context parallel is for long sequences, and for models parallelize lets it split.
    long = lengths.source >= LONG_SEQUENCE and not facts.context_parallel_refused
    for t in divisors(world):
        if shape.num_heads % t or shape.num_kv_heads % t or shape.hidden_dim % t:
            continue
        for cp in divisors(world // t):
            if cp > 1 and (not long or lengths.source % cp):
                continue
            for p in divisors(world // (t * cp)):
                d = world // (t * cp * p)
                if p > facts.num_layers or global_batch % d:
                    continue
                experts = [1]
                if shape.feedforward == "moe" and p == 1 and cp == 1:
                    experts = [e for e in divisors(d) if shape.num_experts % e == 0]
                for ep in experts:
                    replicas = d * cp  # what ZeRO shards over (Layout.data_replicas)
                    zero_stages = (0,) if replicas == 1 else (0, 1)
                    if replicas > 1 and step["implementation"].fsdp:
                        zero_stages += (2, 3) if p == 1 else (2,)
                    configs = []
                    for zero in zero_stages:
                        config = planned_config(
                            dict(
                                data_parallel_size=d,
                                tensor_parallel_size=t,
                                pipeline_parallel_size=p,
                                context_parallel_size=cp,
                                expert_parallel_size=ep,
                                sequence_parallel=t > 1
                                and step["implementation"].sequence_parallel
                                and not facts.sequence_parallel_refused,
                                zero_stage=zero,
                            )
                        )
                        weights = _weights(cluster, config, step["precision"])
                        configs.append(
                            dataclasses.replace(config, device_weights=weights) if weights else config
                        )
                    yield configs


def search(
    facts: ModelFacts,
    cluster: Cluster,
    global_batch: int,
    lengths: Lengths,
    step: dict[str, Any],
    grad_accum_steps: int | None = None,
) -> tuple[list[Plan], list[Plan]]:
    """(the layouts that fit, best first, each runner-up saying why it lost; those priced that do not)."""
    world = cluster.world_size
    ranked: list[tuple[float, list[ParallelConfig]]] = []
    spilled: list[list[ParallelConfig]] = []  # sizes whose state alone overflows a device
    for configs in size_configs(facts, cluster, global_batch, lengths, step):
        probe = Layout(configs[-1], 1, 1, **step)
        try:
            check_layout(facts, probe, world, lengths)
        except ConfigError:
            continue
        if _state_overflows(facts, cluster, probe):
            spilled.append(configs)
            continue
        ranked.append((_time_bound(facts, cluster, probe, global_batch, lengths), configs))
    ranked.sort(key=lambda item: item[0])
    feasible: list[Plan] = []
    infeasible: list[Plan] = []
    fastest = float("inf")
    for bound, configs in ranked:
        if bound > KEEP_WITHIN * fastest:
            break
        for config in configs:
            for plan in _price(facts, cluster, config, global_batch, lengths, step, grad_accum_steps):
                (feasible if plan.fits else infeasible).append(plan)
                if plan.fits:
                    fastest = min(fastest, plan.step_time_s)
    if not feasible and spilled:  # say how close the sizes the bound ruled out come
        for configs in spilled:
            infeasible += _price(facts, cluster, configs[-1], global_batch, lengths, step, grad_accum_steps)
    feasible = [p for p in feasible if p.step_time_s <= KEEP_WITHIN * fastest]
    feasible.sort(key=lambda p: (p.step_time_s, p.memory_bytes))
    if feasible:
        best = feasible[0]
        feasible = [best] + [dataclasses.replace(p, lost_because=why_slower(p, best)) for p in feasible[1:]]
    infeasible.sort(key=lambda p: p.memory_bytes / p.device_memory_bytes)
    return feasible, infeasible


def _price(
    facts: ModelFacts,
    cluster: Cluster,
    config: ParallelConfig,
    global_batch: int,
    lengths: Lengths,
    step: dict[str, Any],
    grad_accum_steps: int | None,
) -> Iterator[Plan]:
    """Every candidate of ``config`` priced, but micro-batches larger than one that did not fit with
    the same schedule and recomputation."""
    rows = global_batch // config.data_parallel_size
    too_big: dict[tuple, int] = {}
    layouts = candidates(config, ALL_OPEN, rows, facts.num_layers, step, None, grad_accum_steps)
    for layout in sorted(layouts, key=lambda layout: layout.micro_batch_size):
        c = layout.config
        family = (c.pipeline_schedule, c.virtual_pipeline_size, c.activation_checkpointing)
        if family in too_big and layout.micro_batch_size > too_big[family]:
            continue
        plan = estimate_layout(facts, cluster, layout, global_batch, lengths)
        if not plan.fits:
            too_big[family] = min(too_big.get(family, layout.micro_batch_size), layout.micro_batch_size)
        yield dataclasses.replace(plan, chosen=chosen_values(plan, ALL_OPEN))


def _state_overflows(facts: ModelFacts, cluster: Cluster, layout: Layout) -> bool:
    """Whether the parameters, gradients and optimizer state of some pipeline rank, under ``layout``'s
    ZeRO stage (the most sharding of its sizes), exceed the smallest device."""
    c = layout.config
    placement = stage_placement(facts, c)
    capacity = min(d.memory_bytes - d.reserved_bytes for d in cluster.distinct)
    for rank in representative_ranks(facts, placement):
        state = state_bytes(facts, stage_groups(facts, placement, rank), layout)
        if state.parameters + state.gradients + state.optimizer > capacity:
            return True
    return False


def _time_bound(
    facts: ModelFacts, cluster: Cluster, layout: Layout, global_batch: int, lengths: Lengths
) -> float:
    """A lower bound on the step time of every layout with ``layout``'s sizes: the pipeline ranks'
    mean work for the whole batch of this rank at once (no recomputation, bubble or data-parallel
    traffic), on the fastest device."""
    c = dataclasses.replace(layout.config, activation_checkpointing="none")
    rows = global_batch // c.data_parallel_size
    bound = dataclasses.replace(layout, config=c, micro_batch_size=rows)
    placement = stage_placement(facts, c)
    device = max(cluster.distinct, key=lambda d: (d.rate(layout.precision), d.memory_bandwidth))
    links = links_of(cluster, c)
    p = c.pipeline_parallel_size
    total = 0.0
    for rank in range(p):
        total += stage_cost(facts, bound, placement, rank, lengths, rows, device, links).total
    return total / p


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
