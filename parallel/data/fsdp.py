"""ZeRO-2/3 on FSDP2: ``fully_shard`` per layer, then the whole model, over the data-parallel ranks.
With tensor parallel the parameters are already DTensors on "tp"; FSDP2 shards them over "dp" (2-D)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from brickwork.parallel.activation_checkpointing import layer_stacks
from brickwork.parallel.config import ParallelConfig

if TYPE_CHECKING:
    from brickwork.parallel.expert_parallel import ExpertParallel

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def apply_fsdp(
    module: nn.Module, config: ParallelConfig, dp_mesh: DeviceMesh, experts: ExpertParallel | None = None
) -> None:
    """ZeRO-2/3: shard each layer of the model's stacks and then the rest, in place, over ``dp_mesh``.

    Under expert parallel each bank of experts is first a unit of its own over the ranks that hold
    the same experts ("edp"); the units around it then leave its parameters out.

    One FSDP unit per layer lets the all-gather of layer i+1 overlap the compute of layer i and
    frees each layer's full parameters after use (ZeRO-3). Mixed precision casts the parameters for
    compute and reduces gradients in fp32; ``cpu_offload`` keeps the shards and optimizer on the CPU.
    """
    mixed = MixedPrecisionPolicy()
    if config.mixed_precision != "fp32":
        mixed = MixedPrecisionPolicy(param_dtype=DTYPES[config.mixed_precision], reduce_dtype=torch.float32)
    offload: OffloadPolicy = OffloadPolicy()
    if config.cpu_offload:
        offload = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    options: dict[str, Any] = dict(
        mesh=dp_mesh, reshard_after_forward=config.zero_stage == 3, mp_policy=mixed, offload_policy=offload
    )
    if experts is not None:
        for bank in experts.banks.values():
            fully_shard(bank, **{**options, "mesh": experts.mesh["edp"]})
    for stack in layer_stacks(module):
        for layer in stack:
            fully_shard(layer, **options)
    fully_shard(module, **options)
