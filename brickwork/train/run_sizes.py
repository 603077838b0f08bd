"""Refuse a run whose batch cannot fit in memory, before its run folder is created.

``train.batch_size=1000000000`` passes every rule of the ``train:`` section, and without this check
the run creates its folder, builds the model and dies (or swaps) at the first step. The estimate is
a floor, from the spec's numbers alone: one micro-batch's hidden states, [rows, tokens, dim_model],
and its logits, [rows, tokens, vocab_size], in float32. A real step needs several times that, so
only a batch that cannot fit by any means is refused; sizing a feasible one is the planner's job.
"""

from __future__ import annotations

import torch

from brickwork.errors import ConfigError
from brickwork.memory import available_bytes, format_bytes
from brickwork.parallel import ParallelConfig
from brickwork.train.run_config import RunConfig
from brickwork.train.tasks import kind_task

FLOAT32 = 4


def activation_floor_bytes(run: RunConfig, layout: ParallelConfig) -> int:
    """Bytes of one micro-batch's hidden states and logits on one data-parallel rank (a lower bound)."""
    spec, cfg = run.spec, run.train
    rows = -(-cfg.batch_size // (layout.data_parallel_size * cfg.grad_accum_steps))
    dim = spec.get("dim_model") or 1
    if kind_task(spec["model"]).sample_unit == "images":
        patch, size = spec.get("patch_size") or 1, spec.get("image_size") or 1
        pixels = (spec.get("channels") or 3) * size * size
        return rows * (pixels + (size // patch) ** 2 * dim) * FLOAT32
    tokens = -(-cfg.seq_len // layout.context_parallel_size)
    vocab = spec.get("vocab_size") or 1
    return rows * tokens * (dim + -(-vocab // layout.tensor_parallel_size)) * FLOAT32


def check_run_sizes(run: RunConfig, layout: ParallelConfig) -> None:
    """Raise ConfigError naming ``train.batch_size`` (or ``train.seq_len``) when one micro-batch's
    activations alone exceed the memory free on the device the run will use, under ``layout`` (the
    dist dict checked against the processes launched)."""
    need = activation_floor_bytes(run, layout)
    device = "cuda" if run.train.device != "cpu" and torch.cuda.is_available() else "cpu"
    free = available_bytes(torch.device(device))
    if need <= free:
        return
    cfg = run.train
    key = "train.seq_len" if cfg.seq_len > cfg.batch_size else "train.batch_size"
    raise ConfigError(
        f"batch_size={cfg.batch_size} x seq_len={cfg.seq_len} needs at least {format_bytes(need)} "
        f"for one micro-batch's activations, more than the {format_bytes(free)} free on {device}; "
        "lower it, or raise train.grad_accum_steps to split the batch",
        key,
    )
