"""The world of this process (one process, or the ranks ``torchrun`` started) against the dist dict."""

from __future__ import annotations

import torch.distributed as dist

from brickwork.errors import ConfigError
from brickwork.launch_env import world_size
from brickwork.parallel import ParallelConfig, build_mesh
from brickwork.parallel.config import WorldSizeError
from brickwork.parallel.mesh import launched_config


def check_world(dist_dict: dict | ParallelConfig) -> ParallelConfig:
    """The dist dict validated by ``brickwork.parallel`` for the processes that were launched.

    A missing ``data_parallel_size`` takes up the processes the other sizes leave (as in LiBai), so
    a bare ``torchrun`` run is data parallel. Sizes that do not multiply to the world size get a
    one-line ConfigError saying how to launch; any other problem names its ``dist.<key>``.
    """
    try:
        return launched_config(dist_dict)
    except WorldSizeError as err:
        wanted, have = err.wanted, err.have
    except ConfigError as err:
        raise err.at("dist") from None
    if have == 1:
        raise ConfigError(
            f"the dist dict asks for {wanted} processes (data x context x tensor x pipeline parallel "
            f"sizes), but this is 1 process; launch it with torchrun --nproc_per_node {wanted} -m brickwork "
            "train ...",
            "dist",
        )
    raise ConfigError(
        f"torchrun started {have} processes, but the dist dict asks for {wanted} (data x context x tensor "
        f"x pipeline parallel sizes); make their product {have} or use --nproc_per_node {wanted}",
        "dist",
    )


def agree_on_rank0(value: str, layout: ParallelConfig) -> str:
    """Rank 0's ``value`` on every rank (a default run folder named by the clock, say).

    Builds the run's device mesh, which starts the process group that ``parallelize`` reuses.
    """
    if world_size() == 1:
        return value
    if not dist.is_initialized():
        build_mesh(layout)
    shared = [value]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]
