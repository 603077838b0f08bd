"""ZeRO-0/1 on DistributedDataParallel, attached to the model itself rather than wrapped around it.

DDP is a wrapper in torch; here it is attached the way torch's composable ``replicate`` attaches it:
a forward pre- and post-hook on the module call the DDP reducer, so the module stays the object the
user holds and keeps its parameter names. DDP works on plain tensors, so a tensor-parallel model is
handed to it as :class:`LocalShards`: its parameters' local shards, which the model then trains.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from types import MethodType
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel


def attach_ddp(
    module: nn.Module,
    dp_mesh: DeviceMesh,
    accumulates: bool = False,
    ignore: Sequence[nn.Parameter] = (),
) -> DistributedDataParallel:
    """ZeRO-0/1: replicate ``module`` over ``dp_mesh``; gradients are averaged in backward. DDP is
    driven by hooks on ``module`` itself (torch ``replicate``'s way), so ``module`` needs no wrapper.
    Returns the DDP object, which holds the reducer.

    ``ignore``: parameters DDP neither broadcasts nor reduces (experts, which differ between ranks).

    ``accumulates``: several backward passes feed one reduction (pipeline microbatches). DDP's
    rebuild of its buckets after the first iteration would then record every parameter once per
    microbatch and fail, so it is turned off by ``find_unused_parameters``, which never rebuilds.
    """
    replicated = LocalShards(module) if any(isinstance(p, DTensor) for p in module.parameters()) else module
    if ignore:
        skip = {id(p) for p in ignore}
        names = [name for name, p in replicated.named_parameters() if id(p) in skip]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(replicated, names)
    ddp = DistributedDataParallel(
        replicated, process_group=dp_mesh.get_group(), find_unused_parameters=accumulates
    )

    def before(_: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        DistributedDataParallel._active_ddp_module = ddp
        return ddp._pre_forward(*args, **kwargs)

    def after(_: nn.Module, args: tuple, output: Any) -> Any:
        DistributedDataParallel._active_ddp_module = None
        return ddp._post_forward(output)

    module.register_forward_pre_hook(before, with_kwargs=True)
    module.register_forward_hook(after)
    return ddp


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


def named_trainable(
    by_name: Mapping[str, torch.Tensor], prefix: str = "", remove_duplicate: bool = True
) -> Iterator[tuple[str, torch.Tensor]]:
    """``named_parameters()`` over ``by_name`` (name -> the tensor the optimizer steps), tied tensors
    once unless ``remove_duplicate`` is False."""
    seen: set[int] = set()
    for name, tensor in by_name.items():
        if remove_duplicate and id(tensor) in seen:
            continue
        seen.add(id(tensor))
        yield (f"{prefix}.{name}" if prefix else name), tensor


def train_local_shards(module: nn.Module, shards: LocalShards) -> None:
    """Make ``module.named_parameters()`` (and ``parameters()``) yield the tensors the optimizer must
    step, ``shards.by_name``, under the single-process names, instead of the DTensor views the
    modules hold. Bound on this instance only: its class stays the user's."""

    def named_parameters(
        self: nn.Module, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, torch.Tensor]]:
        return named_trainable(shards.by_name, prefix, remove_duplicate)

    module.named_parameters = MethodType(named_parameters, module)
