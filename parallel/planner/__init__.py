"""Automatic layouts: a cost model of memory and step time per layout, and a planner that ranks them.

``plan(spec, cluster, global_batch=, seq_len=)`` lists the layouts that fit, best first;
``estimate(spec, cluster, dist, global_batch=, seq_len=)`` prices one dist dict; an encoder-decoder's
decoder may take ``target_len=`` tokens a row of its own (lengths.py). Nothing is built: the spec is
read on the meta device (model_facts.py). See docs/parallel.md, "Planning a layout".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from brickwork.errors import ConfigError
from brickwork.memory import format_bytes
from brickwork.parallel.config import ParallelConfig
from brickwork.parallel.planner.choices import (
    best_plan,
    candidates,
    check_rows,
    divisors,
    open_choices,
    step_fields,
)
from brickwork.parallel.planner.devices import DEVICE_PRESETS, Cluster, Device, device_from, parse_cluster
from brickwork.parallel.planner.estimate import Plan
from brickwork.parallel.planner.layout import check_sequence, planned_config
from brickwork.parallel.planner.lengths import Lengths
from brickwork.parallel.planner.model_facts import ModelFacts, model_facts
from brickwork.parallel.planner.search import search

ClusterSpec = str | Sequence[str | Mapping[str, Any] | Device] | Cluster


def _facts(spec: Any) -> ModelFacts:
    return spec if isinstance(spec, ModelFacts) else model_facts(spec)


def _check_sizes(global_batch: int, seq_len: int, target_len: int | None) -> Lengths:
    """The step's :class:`Lengths`, after checking each size is a positive integer."""
    sizes = (("global_batch", global_batch), ("seq_len", seq_len), ("target_len", target_len))
    for key, value in sizes:
        if key == "target_len" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"must be an integer >= 1, got {value!r}", key)
    return Lengths(seq_len, target_len or seq_len)


def plan(
    spec: Any,
    cluster: ClusterSpec,
    *,
    global_batch: int,
    seq_len: int,
    target_len: int | None = None,
    precision: str = "bf16-mixed",
    optimizer: str = "adamw",
    grad_accum_steps: int | None = None,
    implementation: str = "brickwork",
) -> list[Plan]:
    """The layouts of ``spec`` that fit on ``cluster``, fastest first; runner-ups say why they lost.

    ``spec``: a dict, a .yaml/.json path or a preset name (any model kind). ``cluster``:
    ``"8xH100-80GB"``, ``"48x8xA100-80GB"`` or a list of device descriptions. ``global_batch``
    sequences of ``seq_len`` tokens make one step, an encoder-decoder's with ``target_len`` tokens
    for its decoder (left out: ``seq_len``); ``precision`` and ``optimizer`` are the train
    step's; ``grad_accum_steps`` pins the accumulation of layouts without a pipeline;
    ``implementation`` prices the layouts as another implementation runs them (implementations.py;
    for checking the model against published runs). Layouts a bound proves slower than
    ``KEEP_WITHIN`` times the best are left out unpriced (search.py). Raises ConfigError saying why
    when nothing fits or no layout is valid.
    """
    lengths = _check_sizes(global_batch, seq_len, target_len)
    facts, machines = _facts(spec), parse_cluster(cluster)
    step = step_fields(machines, precision, optimizer, implementation)
    check_sequence(facts, lengths)
    feasible, infeasible = search(facts, machines, global_batch, lengths, step, grad_accum_steps)
    if feasible:
        return feasible
    if not infeasible:
        raise ConfigError(_no_valid_layout(facts, machines.world_size, global_batch, seq_len), "cluster")
    closest = infeasible[0]
    raise ConfigError(
        f"nothing fits on {machines.describe()}: the smallest layout, {closest.name}, needs "
        f"{format_bytes(closest.memory_bytes)} per device and the device has "
        f"{format_bytes(closest.device_memory_bytes)}; "
        "use more or larger devices, a smaller global batch or sequence, or a smaller model",
        "cluster",
    )


def estimate(
    spec: Any,
    cluster: ClusterSpec,
    dist: Mapping[str, Any] | ParallelConfig,
    *,
    global_batch: int,
    seq_len: int,
    target_len: int | None = None,
    precision: str = "bf16-mixed",
    optimizer: str = "adamw",
    grad_accum_steps: int | None = None,
    micro_batch_size: int | None = None,
    implementation: str = "brickwork",
) -> Plan:
    """The :class:`Plan` of one dist dict: memory per device, whether it fits, and step time.

    Each data-parallel rank takes ``global_batch / data_parallel_size`` rows per step. What the dist
    dict and the step leave open (choices.py: the micro-batch size, the number of micro-batches or
    ``grad_accum_steps``, the pipeline schedule, activation recomputation) is chosen: the fastest
    candidate that fits, or the one needing the least memory when none does; ``Plan.chosen`` says
    what was chosen. A dist dict that fixes them is priced as given. ``target_len`` and
    ``implementation``: as in :func:`plan`.
    """
    lengths = _check_sizes(global_batch, seq_len, target_len)
    facts, machines = _facts(spec), parse_cluster(cluster)
    step = step_fields(machines, precision, optimizer, implementation)
    config = planned_config(dist, world_size=machines.world_size)
    open_ = open_choices(dist, config, micro_batch_size, grad_accum_steps)
    rows = check_rows(global_batch, config.data_parallel_size)
    layouts = candidates(config, open_, rows, facts.num_layers, step, micro_batch_size, grad_accum_steps)
    return best_plan(facts, machines, layouts, global_batch, lengths, open_)


def _no_valid_layout(facts: ModelFacts, world: int, global_batch: int, seq_len: int) -> str:
    shape = facts.layers[0]
    prime = len(divisors(world)) == 2
    reasons = [
        f"tensor parallel over {world} does not divide the {shape.num_heads} heads"
        if shape.num_heads % world
        else None,
        f"a {world}-stage pipeline needs {world} layers, the model has {facts.num_layers}"
        if facts.num_layers < world
        else None,
        f"{world} data-parallel ranks do not divide the global batch of {global_batch}"
        if global_batch % world
        else None,
    ]
    head = f"world size {world} is prime, so every layout puts all {world} devices on one dimension, and"
    text = "; ".join(r for r in reasons if r) or f"no layout of {world} devices suits this model"
    return f"no valid layout: {head} {text}" if prime else f"no valid layout on {world} devices: {text}"


__all__ = [
    "DEVICE_PRESETS",
    "Cluster",
    "Device",
    "Plan",
    "device_from",
    "estimate",
    "model_facts",
    "parse_cluster",
    "plan",
]
