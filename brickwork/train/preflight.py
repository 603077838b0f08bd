"""Every check a run's config can fail, made before the run touches the disk.

A start that fails leaves the disk as it was: no ``runs/``, no run folder, no token cache. So the
device, how the batch splits, the data paths, the tokenizer, the training length, the batch's memory
and a CPU run's Triton kernels are all checked here, from the resolved run alone (its dist dict
already checked against the processes launched and its vocabulary against the tokenizer, once, as it
was resolved: brickwork/train/run.py), before the run folder is locked or created.
"""

from __future__ import annotations

import torch

from brickwork.data.sources import data_files
from brickwork.data.tokenizer import Tokenizer
from brickwork.errors import ConfigError
from brickwork.factory.build import build_model
from brickwork.parallel import ParallelConfig
from brickwork.parallel.balance import split_rows
from brickwork.parallel.mesh import mesh_device_type
from brickwork.train.fp8 import check_fp8_run
from brickwork.train.packing import check_packing
from brickwork.train.run import Run
from brickwork.train.run_config import RunConfig
from brickwork.train.run_sizes import check_run_sizes
from brickwork.train.triton_backends import check_triton_backends


def check_before_writing(run: Run) -> None:
    """Raise ConfigError naming the option of the first check ``run`` fails under its layout (its
    dist dict, already checked against the processes launched)."""
    config, layout, spec = run.config, run.layout, run.config.spec
    check_device(config.train.device)
    check_batch_split(config, layout)
    check_run_sizes(config, layout)
    data_files(config.data)  # each path exists and is of a kind the data readers take
    if run.task.uses_tokenizer:
        tokenizer = run.tokenizer
        check_sample_prompt(config, tokenizer)
        limit = spec.get("max_seq_len")
        if limit is not None and config.train.seq_len > limit:
            raise ConfigError(
                f"{config.train.seq_len} is longer than max_seq_len={limit}; lower it or raise max_seq_len",
                "train.seq_len",
            )
        check_packing(config, run.task, tokenizer, spec, layout)
    if config.train.precision == "fp8":
        check_fp8(config, spec, layout)
    check_triton_backends(config)


def check_device(device: str) -> None:
    """``train.device=cuda`` needs a usable CUDA device."""
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("cuda, but no CUDA device is usable here; use train.device=cpu", "train.device")


def check_fp8(run: RunConfig, spec: dict, layout: ParallelConfig) -> None:
    """``train.precision=fp8`` needs float8 matmuls on a GPU, and a linear large enough to convert."""
    with torch.device("meta"):
        model = build_model(spec)
    device = torch.device(mesh_device_type(layout))
    try:
        check_fp8_run(model, run.train.fp8_recipe, run.train.fp8_min_features, device)
    except ConfigError as err:
        raise err.at("train") from None


def check_batch_split(run: RunConfig, layout: ParallelConfig) -> None:
    """``train.batch_size`` rows split over the data-parallel ranks (by ``device_weights`` where they
    weigh them), and each rank's share into ``train.grad_accum_steps`` micro-batches."""
    cfg = run.train
    weights = layout.device_weights if layout.pipeline_parallel_size == 1 else None
    try:
        shares = split_rows(cfg.batch_size, weights, layout.data_parallel_size)
    except ValueError as err:
        raise ConfigError(f"{err}; choose a multiple of it", "train.batch_size") from None
    uneven = [rows for rows in shares if rows % cfg.grad_accum_steps]
    if uneven:
        rows = f"{cfg.batch_size} rows" if len(shares) == 1 else f"a data-parallel rank's {uneven[0]} rows"
        raise ConfigError(
            f"{rows} do not split into grad_accum_steps={cfg.grad_accum_steps} micro-batches; "
            "make the batch a multiple of them",
            "train.batch_size",
        )


def check_sample_prompt(run: RunConfig, tokenizer: Tokenizer) -> None:
    """``train.sample_prompt`` must encode with the run's tokenizer (refused now rather than after
    training)."""
    if run.train.sample_prompt is None:
        return
    try:
        tokenizer.encode(run.train.sample_prompt)
    except ValueError as err:
        raise ConfigError(str(err), "train.sample_prompt") from None
