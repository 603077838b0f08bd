"""Pick the engine for this process: one device, or the parallel layer under ``torchrun``."""

from __future__ import annotations

import math
import os

import torch
import torch.distributed as dist

from brickwork.errors import ConfigError
from brickwork.train.local import LocalEngine, resolve_device
from brickwork.train.parallel_engine import ParallelEngine
from brickwork.train.run_config import RunConfig

SIZE_KEYS = ("data_parallel_size", "tensor_parallel_size", "pipeline_parallel_size")


def world_size() -> int:
    """The number of processes ``torchrun`` started (1 when run directly)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def requested_processes(dist: dict) -> int:
    """dp x tp x pp of a dist dict. Sizes default to 1, except that a missing data-parallel size takes
    up the processes the others leave (as in LiBai), so a bare ``torchrun`` run is data parallel."""
    sizes = []
    for key in SIZE_KEYS:
        value = dist.get(key, 1)
        if key == "data_parallel_size" and key not in dist:
            others = dist.get("tensor_parallel_size", 1) * dist.get("pipeline_parallel_size", 1)
            if isinstance(others, int) and others > 0 and world_size() % others == 0:
                value = world_size() // others
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"must be a positive integer, got {value!r}", f"dist.{key}")
        sizes.append(value)
    return math.prod(sizes)


def check_world(dist: dict) -> None:
    """The dist dict must ask for exactly the processes that were launched."""
    wanted, have = requested_processes(dist), world_size()
    if wanted == have:
        return
    if have == 1:
        raise ConfigError(
            f"the dist dict asks for {wanted} processes (data x tensor x pipeline parallel sizes), but this "
            f"is 1 process; launch it with torchrun --nproc_per_node {wanted} -m brickwork train ...",
            "dist",
        )
    raise ConfigError(
        f"torchrun started {have} processes, but the dist dict asks for {wanted} (data x tensor x pipeline "
        f"parallel sizes); make their product {have} or use --nproc_per_node {wanted}",
        "dist",
    )


def resolve_dist(dist: dict) -> dict:
    """The dist dict with every key (defaults filled, LiBai spellings translated), for config.yaml."""
    from brickwork.parallel import ParallelConfig

    try:
        return ParallelConfig.from_dict(dist, world_size=world_size()).to_dict()
    except ConfigError as err:
        raise err.at("dist") from None


def agree_on_rank0(value: str, dist_dict: dict) -> str:
    """Rank 0's ``value`` on every rank (a default run folder named by the clock, say).

    Starts the process group the way ``brickwork.parallel`` would, so it is reused there.
    """
    if world_size() == 1:
        return value
    from brickwork.parallel import ParallelConfig
    from brickwork.parallel.mesh import mesh_device_type

    if not dist.is_initialized():
        device_type = mesh_device_type(ParallelConfig.from_dict(dist_dict, world_size=world_size()))
        if device_type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    shared = [value]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]


def make_engine(model: torch.nn.Module, run: RunConfig) -> LocalEngine | ParallelEngine:
    """A LocalEngine in a single process; a ParallelEngine under torchrun."""
    check_world(run.dist)
    if world_size() == 1:
        return LocalEngine(model, resolve_device(run.train.device), run.train.precision, run.train.grad_clip)
    return ParallelEngine(model, run)
