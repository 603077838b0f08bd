"""``dist: auto`` (or ``dist.auto=true``): the planner picks the run's layout at launch.

The cluster is what was launched: ``WORLD_SIZE`` processes, ``LOCAL_WORLD_SIZE`` of them per node,
each with the memory its device has free now (a GPU's free bytes; on CPU, the host's available
memory shared by the processes on it). The global batch, sequence length, gradient accumulation and
precision come from the ``train:`` section. Rank 0's choice is broadcast, so every rank runs the same
layout; the other ``dist`` keys the user gave (a device type, a timeout) are kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from brickwork.errors import ConfigError
from brickwork.launch_env import is_first_rank, local_world_size, world_size
from brickwork.memory import available_bytes
from brickwork.parallel.mesh import local_device_index, start_process_group
from brickwork.parallel.planner import Device, plan
from brickwork.parallel.planner.devices import running_preset
from brickwork.parallel.planner.report import plan_table
from brickwork.train.config import TrainConfig
from brickwork.train.distributed import check_world

# The keys a plan decides; any other key the user gave beside ``auto`` stays as it is.
PLANNED_KEYS = (
    "data_parallel_size",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "context_parallel_size",
    "expert_parallel_size",
    "sequence_parallel",
    "zero_stage",
    "cpu_offload",
    "activation_checkpointing",
    "num_microbatches",
    "pipeline_schedule",
    "virtual_pipeline_size",
    "device_weights",
)


def wants_auto(dist_dict: Any) -> bool:
    """Whether a run's ``dist`` asks for an automatic layout: ``dist: auto`` or ``dist.auto: true``."""
    if dist_dict == "auto":
        return True
    return isinstance(dist_dict, Mapping) and dist_dict.get("auto") is True


def local_device(world_size: int, per_node: int) -> Device:
    """This process's device as the planner sees it: its free memory now, and its preset's rates when
    one describes it (:func:`running_preset`; the rates rank layouts, the memory decides what fits)."""
    if torch.cuda.is_available():
        gpu = torch.device("cuda", local_device_index())
        free = available_bytes(gpu)
        preset = running_preset(gpu)
        if preset is not None:
            return dataclasses.replace(preset, memory_bytes=free, reserved_bytes=0)
        return Device(torch.cuda.get_device_name(gpu), free, 100e12, 20e12)
    free = available_bytes(torch.device("cpu")) // per_node
    # A CPU process: tens of GFLOP/s, and gloo's few GB/s between processes.
    return Device(
        "cpu",
        free,
        peak_flops_bf16=50e9,
        peak_flops_fp32=50e9,
        achievable_fraction=1.0,
        intra_node_bandwidth=5e9,
        inter_node_bandwidth=1e9,
        memory_bandwidth=10e9,
        triton_kernels=False,
    )


def choose_layout(
    spec: dict[str, Any], dist_dict: Any, train: TrainConfig, lengths: tuple[int, int] | None = None
) -> dict[str, Any]:
    """The dist dict the planner picks for ``spec`` on the launched world, merged over the user's
    other ``dist`` keys; printed on rank 0. ``lengths``: the (source, target) tokens a row puts
    through the model (Task.model_lengths; left out, ``train.seq_len`` both)."""
    others = {k: v for k, v in dist_dict.items() if k != "auto"} if isinstance(dist_dict, Mapping) else {}
    clash = sorted(set(others) & set(PLANNED_KEYS))
    if clash:
        raise ConfigError(f"dist.auto picks {clash} itself; give them without auto, or drop them", "dist")
    world = world_size()
    per_node = local_world_size()
    device = local_device(world, per_node)
    cluster = [dataclasses.replace(device, node=rank // per_node) for rank in range(world)]
    # fp8 is priced with float8 matmuls where the device's preset has them; elsewhere (a CPU, which
    # emulates them, or a GPU no preset describes) at the bf16 rate: the same weights, optimizer
    # state and saved activations either way (a Float8Linear keeps its bf16 input for backward).
    precision = train.precision
    if precision == "fp8" and device.peak_flops_fp8 == 0:
        precision = "bf16-mixed"
    source, target = lengths or (train.seq_len, train.seq_len)
    plans = plan(
        spec,
        cluster,
        global_batch=train.batch_size,
        seq_len=source,
        target_len=target,
        precision=precision,
        optimizer=train.optimizer,
        grad_accum_steps=train.grad_accum_steps,
    )
    chosen = _agree(plans[0].dist, world, others)
    if is_first_rank():
        print(f"dist: auto picked {plans[0].name} of {len(plans)} layouts that fit:\n{plan_table(plans, 3)}")
    return {**others, **{k: v for k, v in chosen.items() if k in PLANNED_KEYS}}


def _agree(chosen: dict[str, Any], world: int, others: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's choice on every rank (free memory differs a little from process to process), over
    the process group the run then keeps, started as the user's other ``dist`` keys (a device type, a
    timeout) say."""
    if world == 1:
        return chosen
    start_process_group(check_world(others))
    shared = [chosen]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]
