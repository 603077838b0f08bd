"""The choices a dist dict may leave open, and the candidates for each.

A layout is fixed by its sizes and ZeRO stage, and by four more choices: the micro-batch size, the
number of micro-batches (gradient accumulation without a pipeline), the pipeline schedule (with its
virtual stages) and activation recomputation. ``estimate`` prices every candidate of the choices a
dist dict leaves open and keeps the fastest that fits (:func:`best_plan`); ``plan`` does the same for
every size and ZeRO stage it tries. A dist dict fixes a choice by naming its key (``num_microbatches``,
``pipeline_schedule`` or ``virtual_pipeline_size``, ``activation_checkpointing``); the micro-batch
size and the accumulation are the train step's, which ``estimate`` takes as arguments.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from brickwork.errors import ConfigError
from brickwork.parallel.config import ParallelConfig
from brickwork.parallel.planner.devices import Cluster
from brickwork.parallel.planner.estimate import Plan, estimate_layout
from brickwork.parallel.planner.implementations import implementation as implementation_named
from brickwork.parallel.planner.layout import Layout, check_step_options
from brickwork.parallel.planner.lengths import Lengths
from brickwork.parallel.planner.model_facts import ModelFacts

MICRO_BATCH = "micro_batch_size"
MICROBATCHES = "num_microbatches"
SCHEDULE = "pipeline_schedule"
RECOMPUTE = "activation_checkpointing"
ALL_OPEN = frozenset({MICRO_BATCH, MICROBATCHES, SCHEDULE, RECOMPUTE})

MAX_MICRO_BATCH = 32
RECOMPUTE_CHOICES = ("none", "selective", "full")
VIRTUAL_STAGES = (2, 4, 8)


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def open_choices(
    dist: Mapping[str, Any] | ParallelConfig,
    config: ParallelConfig,
    micro_batch_size: int | None,
    grad_accum_steps: int | None,
) -> frozenset[str]:
    """What ``dist`` (read into ``config``) and the train step's ``micro_batch_size`` and
    ``grad_accum_steps`` leave open. A ParallelConfig states every key, so it leaves only those two;
    one of them, or a pipeline's ``num_microbatches``, fixes the other."""
    given = (
        {f.name for f in dataclasses.fields(ParallelConfig)}
        if isinstance(dist, ParallelConfig)
        else set(dist)
    )
    out = set()
    pipeline = config.pipeline_parallel_size > 1
    count_given = MICROBATCHES in given if pipeline else grad_accum_steps is not None
    if micro_batch_size is None and not count_given:
        out |= {MICRO_BATCH, MICROBATCHES}
    if pipeline and SCHEDULE not in given and "virtual_pipeline_size" not in given:
        out.add(SCHEDULE)
    if RECOMPUTE not in given and "activation_checkpoint" not in given:  # LiBai's spelling
        out.add(RECOMPUTE)
    return frozenset(out)


def candidates(
    config: ParallelConfig,
    open_: frozenset[str],
    rows: int,
    num_layers: int,
    step: dict[str, Any],
    micro_batch_size: int | None = None,
    grad_accum_steps: int | None = None,
) -> Iterator[Layout]:
    """Every layout of ``config`` over the choices ``open_`` leaves open, for ``rows`` rows per
    data-parallel rank and step. ``step`` holds the Layout's other fields (``step_fields``). Fixed
    choices keep ``config``'s values."""
    p = config.pipeline_parallel_size
    recomputes = (config.activation_checkpointing,)
    if RECOMPUTE in open_:
        selective = step["implementation"].selective is not None
        recomputes = tuple(r for r in RECOMPUTE_CHOICES if r != "selective" or selective)
    if p == 1:
        for b in _micro_batches(rows, micro_batch_size, grad_accum_steps, MICRO_BATCH in open_):
            for recompute in recomputes:
                changed = dataclasses.replace(config, activation_checkpointing=recompute)
                yield Layout(changed, b, rows // b, **step)
        return
    accum = grad_accum_steps or 1
    if rows % accum:
        return
    per_step = rows // accum
    if micro_batch_size is not None or MICROBATCHES in open_:
        sizes = _micro_batches(per_step, micro_batch_size, None, True)
    else:
        m = config.microbatches
        sizes = [per_step // m] if per_step % m == 0 else []
    for b in sizes:
        m = per_step // b
        for schedule, v in _schedules(config, SCHEDULE in open_, m, num_layers):
            for recompute in recomputes:
                changed = dataclasses.replace(
                    config,
                    num_microbatches=m,
                    pipeline_schedule=schedule,
                    virtual_pipeline_size=v,
                    activation_checkpointing=recompute,
                )
                yield Layout(changed, b, accum, **step)


def _micro_batches(rows: int, size: int | None, accum: int | None, open_: bool) -> list[int]:
    """Micro-batch sizes splitting ``rows``: the given size or accumulation, else every divisor up to
    MAX_MICRO_BATCH (all the rows at once when the size is not open)."""
    if accum is not None:
        return [rows // accum] if rows % accum == 0 else []
    if size is not None:
        return [size] if rows % size == 0 else []
    return [b for b in divisors(rows) if b <= MAX_MICRO_BATCH] if open_ else [rows]


def _schedules(config: ParallelConfig, open_: bool, m: int, num_layers: int) -> list[tuple[str, int]]:
    """(schedule, virtual stages) pairs valid for ``m`` micro-batches on ``config``'s pipeline."""
    p = config.pipeline_parallel_size
    if not open_:
        chosen = [(config.pipeline_schedule, config.virtual_pipeline_size)]
    else:
        chosen = [("1f1b", 1), ("gpipe", 1)] + [("interleaved_1f1b", v) for v in VIRTUAL_STAGES]
    valid = []
    for schedule, v in chosen:
        if schedule != "gpipe" and m < p:
            continue
        if schedule == "interleaved_1f1b" and (m % p or num_layers < p * v):
            continue
        valid.append((schedule, v))
    return valid


def step_fields(cluster: Cluster, precision: str, optimizer: str, implementation: str) -> dict[str, Any]:
    """The Layout fields the train step, its implementation and the devices fix (``candidates``'
    ``step``); ConfigError for an unknown precision, optimizer or implementation, or for fp8 on a
    device without float8 matmuls."""
    check_step_options(precision, optimizer)
    lacking = (
        sorted({d.name for d in cluster.distinct if d.peak_flops_fp8 == 0}) if precision == "fp8" else []
    )
    if lacking:
        raise ConfigError(
            f"fp8 needs float8 matmuls, which {', '.join(lacking)} has none of (give a device's "
            "fp8_tflops, or plan bf16-mixed)",
            "precision",
        )
    return {
        "precision": precision,
        "optimizer": optimizer,
        "gpu_kernels": all(device.triton_kernels for device in cluster.distinct),
        "implementation": implementation_named(implementation, precision),
    }


def check_rows(global_batch: int, data_parallel_size: int) -> int:
    """Rows per data-parallel rank and step; ConfigError when the ranks do not divide the batch."""
    if global_batch % data_parallel_size:
        raise ConfigError(
            f"global_batch={global_batch} does not split over data_parallel_size {data_parallel_size}",
            "global_batch",
        )
    return global_batch // data_parallel_size


def best_plan(
    facts: ModelFacts,
    cluster: Cluster,
    layouts: Iterable[Layout],
    global_batch: int,
    lengths: Lengths,
    open_: frozenset[str],
) -> Plan:
    """The fastest of ``layouts`` that fits, or when none does the one needing the least memory, with
    what it chose for the choices ``open_`` left open (choices.py)."""
    best, best_key = None, None
    for layout in layouts:
        plan = estimate_layout(facts, cluster, layout, global_batch, lengths)
        key = (
            (0, plan.step_time_s, plan.memory_bytes)
            if plan.fits
            else (1, plan.memory_bytes, plan.step_time_s)
        )
        if best_key is None or key < best_key:
            best, best_key = plan, key
    if best is None:
        raise ConfigError(
            f"global_batch={global_batch} does not split into the micro-batches the dist dict asks"
        )
    return dataclasses.replace(best, chosen=chosen_values(best, open_))


def chosen_values(plan: Plan, open_: frozenset[str]) -> dict[str, Any]:
    """What ``plan`` holds for each choice of ``open_`` (choices.py's names)."""
    d = plan.dist
    pipeline = d.get("pipeline_parallel_size", 1) > 1
    out: dict[str, Any] = {}
    if "micro_batch_size" in open_:
        out["micro_batch_size"] = plan.micro_batch_size
    if "num_microbatches" in open_:
        out.update(
            {"num_microbatches": d["num_microbatches"]}
            if pipeline
            else {"grad_accum_steps": plan.grad_accum_steps}
        )
    if "pipeline_schedule" in open_ and pipeline:
        out["pipeline_schedule"] = d.get("pipeline_schedule", "1f1b")
        out["virtual_pipeline_size"] = d.get("virtual_pipeline_size", 1)
    if "activation_checkpointing" in open_:
        out["activation_checkpointing"] = d.get("activation_checkpointing", "none")
    return out
