"""Data parallel and ZeRO on torch's own engines.

| zero_stage | engine                                                      |
|------------|-------------------------------------------------------------|
| 0          | DistributedDataParallel                                     |
| 1          | DistributedDataParallel + ZeroRedundancyOptimizer           |
| 2          | FSDP2 ``fully_shard(reshard_after_forward=False)``          |
| 3          | FSDP2 ``fully_shard`` (parameters resharded after forward)  |

With tensor parallel the model's parameters are already DTensors on the "tp" mesh dim; FSDP2 shards
them over "dp", giving a 2-D layout, and DDP all-reduces their local shards over "dp".
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from brickwork.parallel.activation_checkpointing import layer_stacks
from brickwork.parallel.config import ParallelConfig
from brickwork.parallel.expert_parallel import ExpertParallel, ZeroBesideExperts

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


def apply_ddp(
    module: nn.Module,
    dp_mesh: DeviceMesh,
    accumulates: bool = False,
    ignore: Sequence[nn.Parameter] = (),
) -> DistributedDataParallel:
    """ZeRO-0/1: replicate ``module`` over ``dp_mesh``; gradients are averaged in backward.

    ``ignore``: parameters DDP neither broadcasts nor reduces (experts, which differ between ranks).

    DDP works on plain tensors, so a tensor-parallel model is handed to it as :class:`LocalShards`.
    ``accumulates``: several backward passes feed one reduction (pipeline microbatches). DDP's
    rebuild of its buckets after the first iteration would then record every parameter once per
    microbatch and fail, so it is turned off by ``find_unused_parameters``, which never rebuilds.
    """
    if any(isinstance(p, DTensor) for p in module.parameters()):
        module = LocalShards(module)
    if ignore:
        skip = {id(p) for p in ignore}
        names = [name for name, p in module.named_parameters() if id(p) in skip]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, names)
    return DistributedDataParallel(
        module, process_group=dp_mesh.get_group(), find_unused_parameters=accumulates
    )


class LocalShards(nn.Module):
    """A tensor-parallel model seen by DDP: its parameters are this rank's local shards.

    Each DTensor parameter is split into a plain Parameter (its local shard: what DDP all-reduces
    and the optimizer updates) and a DTensor view made from it once with ``DTensor.from_local``,
    which the model keeps using. The view shares the shard's storage, so optimizer updates show
    through, and its autograd edge leads every backward into the shard's gradient. Tied weights keep
    one shard and one view. Each shard remembers its layout in ``_st_info`` (torch's DDP + TP
    convention), for gradient clipping and checkpoints.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.shards = nn.ParameterList()
        self._model = [model]  # not a submodule: DDP must see the shards only
        # The trainable tensor (the shard) behind each of the model's parameter names.
        self.by_name: dict[str, nn.Parameter] = {}
        views: dict[int, tuple[torch.Tensor, nn.Parameter]] = {}
        for prefix, holder in model.named_modules():
            for name, param in list(holder._parameters.items()):
                if param is None:
                    continue
                if id(param) not in views:
                    views[id(param)] = (self._split(param), self.shards[-1])
                holder._parameters[name] = views[id(param)][0]
                self.by_name[f"{prefix}.{name}" if prefix else name] = views[id(param)][1]

    def _split(self, param: nn.Parameter) -> torch.Tensor:
        if not isinstance(param, DTensor):
            self.shards.append(param)
            return param
        spec = param._spec
        shard = nn.Parameter(param.to_local().detach(), requires_grad=param.requires_grad)
        shard._st_info = spec
        self.shards.append(shard)
        return DTensor.from_local(
            shard, spec.mesh, spec.placements, run_check=False, shape=spec.shape, stride=spec.stride
        )

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._model[0](*args, **kwargs)


class ZeroOptimizers:
    """ZeRO-1: the optimizer a user built is re-created as a ZeroRedundancyOptimizer over the dp group.

    Each rank keeps the optimizer state of its 1/dp of the parameters only. The user's optimizer
    stays the source of hyperparameters: its param-group values (e.g. an LR schedule's ``lr``) are
    copied over before every step. ``experts`` (expert parallel: different tensors on each rank) are
    left out of the ZeRO partition and stepped by a plain optimizer of the same class beside it
    (:class:`~brickwork.parallel.expert_parallel.ZeroBesideExperts`).
    """

    def __init__(self, dp_mesh: DeviceMesh, experts: Sequence[nn.Parameter] = ()) -> None:
        self.group = dp_mesh.get_group()
        self._experts = {id(p) for p in experts}
        self._by_user: dict[int, tuple[torch.optim.Optimizer, Any]] = {}

    def get(self, optimizer: torch.optim.Optimizer) -> ZeroRedundancyOptimizer | ZeroBesideExperts:
        if isinstance(optimizer, ZeroRedundancyOptimizer | ZeroBesideExperts):
            return optimizer
        entry = self._by_user.get(id(optimizer))
        if entry is None:
            # Only what the class's constructor takes: defaults may hold derived keys (AdamW's
            # decoupled_weight_decay) that its __init__ does not accept.
            accepted = set(inspect.signature(type(optimizer).__init__).parameters)
            groups = [
                {**group, "params": [p for p in group["params"] if id(p) not in self._experts]}
                for group in optimizer.param_groups
            ]
            options = {k: v for k, v in groups[0].items() if k in accepted and k != "params"}
            zero = ZeroRedundancyOptimizer(
                groups[0].pop("params"), optimizer_class=type(optimizer), process_group=self.group, **options
            )
            for group in groups[1:]:
                zero.add_param_group(group)
            stepped = ZeroBesideExperts(zero, optimizer, self._experts, options) if self._experts else zero
            entry = (optimizer, stepped)
            self._by_user[id(optimizer)] = entry
        user, stepped = entry
        for owned in stepped.parts if isinstance(stepped, ZeroBesideExperts) else [stepped]:
            for user_group, group in zip(user.param_groups, owned.param_groups):
                group.update({k: v for k, v in user_group.items() if k != "params"})
        return stepped
