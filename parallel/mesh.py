"""The device mesh of a dist dict: dims ("pp", "dp", "cp", "tp"), ranks grouped as in LiBai."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from brickwork import launch_env
from brickwork.parallel.config import ParallelConfig

MESH_DIMS = ("pp", "dp", "cp", "tp")


def mesh_device_type(config: ParallelConfig) -> str:
    """``device_type`` from the dist dict, else cuda when there is a GPU (nccl) and cpu otherwise (gloo)."""
    if config.device_type is not None:
        return config.device_type
    return "cuda" if torch.cuda.is_available() else "cpu"


def build_mesh(dist_config: Mapping[str, Any] | ParallelConfig) -> DeviceMesh:
    """A DeviceMesh of shape (pp, dp, cp, tp) with those dim names, every dim present even at size 1.

    The mesh is laid out row-major over the ranks, so tensor parallel is innermost, then context, then
    data, then pipeline (LiBai's grouping, with context parallel between data and tensor parallel): with
    8 ranks and dp=2, tp=4 the TP groups are [0..3] and [4..7]; with pp=dp=tp=2, stage 0 holds ranks
    0-3, TP pairs [0,1], [2,3] and DP pairs [0,2], [1,3]; with dp=cp=2 the CP pairs are [0,1], [2,3].
    Starts the default process group from the torchrun environment if it is not up yet; a plain
    ``python`` process (no ``RANK`` in the environment) is a world of one.
    """
    config = launched_config(dist_config)
    start_process_group(config)
    device_type = mesh_device_type(config)
    if device_type == "cuda":  # again, for a process group the caller started
        torch.cuda.set_device(local_device_index())
    return init_device_mesh(device_type, config.mesh_shape, mesh_dim_names=MESH_DIMS)


def launched_config(dist_config: Mapping[str, Any] | ParallelConfig) -> ParallelConfig:
    """The dist dict validated for this run's world size (``launch_env.world_size``): the one place
    a dist dict becomes the :class:`ParallelConfig` that ``parallelize`` and its steps pass on. A
    ParallelConfig is only checked against the world size."""
    return ParallelConfig.from_dict(dist_config, world_size=launch_env.world_size())


def mesh_device(mesh: DeviceMesh) -> torch.device:
    """The device this rank computes on."""
    index = torch.cuda.current_device() if mesh.device_type == "cuda" else None
    return torch.device(mesh.device_type, index)


def data_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The ranks holding the same parameters on different tokens, over which gradients are reduced:
    "dp", flattened with "cp" when context parallel is on (each cp rank sees other positions)."""
    if mesh["cp"].size() == 1:
        return mesh["dp"]
    return mesh["dp", "cp"]._flatten("dp_cp")


def own_group(rank_lists: Iterable[list[int]]) -> dist.ProcessGroup | None:
    """A process group of each list of global ranks, created on every rank in the same order
    (``new_group`` is collective); returns the one that holds this rank, None if none does."""
    found = None
    for ranks in rank_lists:
        group = dist.new_group(ranks)
        if dist.get_rank() in ranks:
            found = group
    return found


def start_process_group(config: ParallelConfig) -> None:
    """Start the default process group if it is not up: from the torchrun environment, or, in a plain
    ``python`` process (no ``RANK`` in the environment), as a world of one. The dist dict's
    ``timeout_s`` bounds how long the start, and every collective after it, waits for a peer.

    On CUDA the group is bound to this process's GPU (made the current device first): every
    collective, ``barrier`` included, then knows its device instead of guessing the current one (and
    warning that it does), and NCCL sets its communicators up at the start rather than lazily."""
    if dist.is_initialized():
        return
    timeout = timedelta(seconds=config.timeout_s)
    backend, gpu = "gloo", None
    if mesh_device_type(config) == "cuda":
        backend, gpu = "nccl", torch.device("cuda", local_device_index())
        torch.cuda.set_device(gpu)
    if launch_env.launched():
        launch_env.check_launch_environment()
        dist.init_process_group(backend, timeout=timeout, device_id=gpu)
    else:
        store = dist.HashStore()
        dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout, device_id=gpu)


def local_device_index() -> int:
    """This process's GPU on its node: torchrun's ``LOCAL_RANK``. The global rank modulo the device
    count is only a fallback for launchers that do not set it: on nodes with different GPU counts, or
    ranks not numbered node by node, it would put two processes on one GPU."""
    local = launch_env.local_rank()
    if local is not None:
        return local
    return launch_env.rank() % torch.cuda.device_count()
