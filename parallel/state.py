"""What training needs to know about a parallelized model, and nothing about losses.

The apply steps of ``parallelize`` record what they did in the model's :class:`ParallelState`, read
with :func:`parallel_state`: the dp group, gradient sync on or off, pending gradient reductions, the
gradient norm over every mesh dim, the ZeRO-1 optimizer, the expert split.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel

from brickwork.parallel.config import ParallelConfig
from brickwork.parallel.data.ddp import LocalShards
from brickwork.parallel.data.zero import ZeroOptimizers
from brickwork.parallel.grad_norm import clip_grad_norm, settle_gradients
from brickwork.parallel.mesh import data_mesh, mesh_device, own_group

if TYPE_CHECKING:
    from brickwork.parallel.expert_parallel import ExpertParallel

STATE_ATTR = "_brickwork_parallel_state"


def parallel_state(model: nn.Module) -> ParallelState | None:
    """The layout ``parallelize`` applied to ``model``, or None for a plain single-process module."""
    return getattr(model, STATE_ATTR, None)


def layout_state(model: nn.Module, mesh: DeviceMesh, config: ParallelConfig) -> ParallelState:
    """``model``'s ParallelState, attached on first use: the record the apply steps write into.

    Collective the first time (it creates the batch group): every rank calls it at the same step."""
    state = parallel_state(model)
    if state is None:
        state = ParallelState(config, mesh, [model])
        setattr(model, STATE_ATTR, state)
    return state


class ParallelState:
    """What training needs to know about a parallelized model, and nothing about losses.

    ``modules`` are the model (or this rank's pipeline stages), whose state dicts use the
    single-process names; ``ddps`` are the DDP objects attached to them (none under FSDP or dp=1);
    ``experts`` is the expert-parallel split, if any. ``dp_group`` holds the ``data_replicas`` ranks
    that hold the same parameters and see other tokens, over which gradients and losses are reduced:
    dp, times cp under context parallel.
    """

    def __init__(
        self,
        config: ParallelConfig,
        mesh: DeviceMesh,
        modules: Sequence[nn.Module],
        ddps: Sequence[DistributedDataParallel] = (),
        experts: ExpertParallel | None = None,
    ) -> None:
        self.config = config
        self.experts = experts
        self.mesh = mesh
        self.device = mesh_device(mesh)
        self.modules = list(modules)
        self.ddps = list(ddps)
        self.replicas = data_mesh(mesh)
        self.dp_group, self.data_replicas = self.replicas.get_group(), self.replicas.size()
        self._zero: ZeroOptimizers | None = None
        self.batch_group = _batch_group(mesh)
        self._parameters: list[torch.Tensor] | None = None

    @property
    def is_pipeline(self) -> bool:
        return self.config.pipeline_parallel_size > 1

    def trainable(self) -> dict[str, torch.Tensor]:
        """Each parameter name (tied names too) -> the tensor the optimizer holds for it: the
        parameter, or under DDP + TP its local shard (data/ddp.py, LocalShards)."""
        out: dict[str, torch.Tensor] = {}
        shards = {id(d.module._model[0]): d.module for d in self.ddps if isinstance(d.module, LocalShards)}
        for module in self.modules:
            local = shards.get(id(module))
            out.update(
                local.by_name if local is not None else module.named_parameters(remove_duplicate=False)
            )
        return out

    def parameters(self) -> list[torch.Tensor]:
        """The tensors the optimizer steps, each once. Fixed once the layout is complete (FSDP2 swaps
        unsharded weights in only inside forward and backward), so found at the first call, which
        training makes after the last apply step (as the optimizer is built on them): walking the
        modules for them every step costs a small model's CPU step more than its gradient clipping."""
        if self._parameters is None:
            self._parameters = list({id(t): t for t in self.trainable().values()}.values())
        return self._parameters

    def local_state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's state by single-process names: DTensors where sharded, sharing storage."""
        out: dict[str, torch.Tensor] = {}
        for module in self.modules:
            out.update(module.state_dict())
        return out

    def stepped_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer that really steps for ``optimizer``: under ZeRO-1 its ZeroRedundancyOptimizer
        (each rank holding 1/dp of the state), otherwise ``optimizer``."""
        if self.config.zero_stage != 1:
            return optimizer
        if self._zero is None:
            experts = self.experts.parameters() if self.experts is not None else ()
            self._zero = ZeroOptimizers(self.replicas, experts)
        return self._zero.get(optimizer)

    def set_gradient_sync(self, enabled: bool) -> None:
        """Whether the next backward reduces gradients over dp (off for all but the last micro-step
        of gradient accumulation): DDP's ``no_sync`` switch, FSDP's ``set_requires_gradient_sync``."""
        for ddp in self.ddps:
            ddp.require_backward_grad_sync = enabled
        for module in self.modules:
            if isinstance(module, FSDPModule):
                module.set_requires_gradient_sync(enabled)

    def finish_gradients(self) -> None:
        """Carry out reductions still pending after backward (a Partial gradient under sequence
        parallel); the pipeline adds the sum of a tied weight's gradient over its stages."""
        settle_gradients(self.parameters())
        if self.experts is not None:
            self.experts.finish_gradients()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Scale the gradients so the full gradient's 2-norm is at most ``max_norm``; returns the norm."""
        split = [(self.experts.parameters(), self.experts.group)] if self.experts is not None else []
        return clip_grad_norm(self.parameters(), max_norm, split_over=split)


def _batch_group(mesh: DeviceMesh) -> dist.ProcessGroup | None:
    """The group of this rank's pipeline-, context- and tensor-parallel peers (one data-parallel index),
    whose first rank the others take the batch from; None when it is this rank alone. Context-parallel
    peers share the batch and each takes its slice of the sequence.
    """
    grid = mesh.mesh  # [pp, dp, cp, tp] global ranks
    if grid.numel() == grid.shape[1]:
        return None
    return own_group([int(r) for r in grid[:, dp_index].flatten()] for dp_index in range(grid.shape[1]))
