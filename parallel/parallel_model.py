"""``parallelize(model, dist)``: the layout applied to the model in place (the contract of DESIGN.md).

Tensor parallel, activation checkpointing and FSDP2 change the model's own modules. DDP, which is a
wrapper in torch, is attached the way torch's composable ``replicate`` attaches it: a forward pre-
and post-hook on the model call the DDP reducer, so the model stays the object the user holds and
keeps its parameter names. What a train step needs from the layout (the dp group, gradient sync on
or off, pending gradient reductions, the gradient norm over every mesh dim, the ZeRO-1 optimizer)
is the model's :class:`ParallelState`, read with :func:`parallel_state`. Nothing here knows a loss.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel

from brickwork.errors import ConfigError
from brickwork.parallel.activation_checkpointing import apply_activation_checkpointing
from brickwork.parallel.agreement import check_agreement
from brickwork.parallel.config import ParallelConfig
from brickwork.parallel.context_parallel import apply_context_parallel, check_context_parallel
from brickwork.parallel.data_parallel import LocalShards, ZeroOptimizers, apply_ddp, apply_fsdp
from brickwork.parallel.expert_parallel import ExpertParallel, check_expert_parallel, expert_module_paths
from brickwork.parallel.grad_norm import clip_grad_norm, settle_gradients
from brickwork.parallel.materialize import materialize, take_source, uses_meta_init
from brickwork.parallel.mesh import build_mesh, data_mesh, start_process_group
from brickwork.parallel.parts import keep_whole, whole_modules
from brickwork.parallel.plans import plan_for
from brickwork.parallel.tensor_parallel import (
    PlanValue,
    apply_tensor_parallel,
    check_tensor_parallel,
    component_plan,
    merge_plans,
    name_plan,
)
from brickwork.parallel.vocab_padding import pad_source

STATE_ATTR = "_brickwork_parallel_state"


def parallelize(
    model: nn.Module,
    dist_config: Mapping[str, Any] | ParallelConfig,
    *,
    plan: Mapping[str, PlanValue] | None = None,
    divide: Mapping[str, Sequence[str]] | None = None,
) -> nn.Module:
    """Lay ``model`` out over all ranks as the dist dict says, in place; every rank calls it.

    Returns ``model`` itself, whose ``.parameters()`` are now this rank's (shards under TP/FSDP), or
    with ``pipeline_parallel_size`` > 1 a :class:`~brickwork.parallel.pipeline_model.PipelinedModel`
    holding this rank's stages and the schedule. Tensor parallel follows the components' own
    ``tp_plan()`` declarations, plus ``plan`` (glob pattern -> style, or -> {child: style} for an owner
    of children under different parents), whose entries win over a
    component's entry for the same module: that is how a model brickwork did not build is sharded
    (``divide`` names attributes such as head counts to divide by the TP size). HF GPT-2, Llama,
    GPT-NeoX and BERT models need neither: their family modules (brickwork.factory.hf) declare them.
    Every check runs before the first collective, so a bad dist dict raises the same ConfigError on
    every rank. Rank 0
    may pass the real model while the others pass it built on the meta device (parallel/materialize.py),
    except under a pipeline. In a plain ``python`` process this is a world of one.
    """
    start_process_group(dist_config)
    # Before the mesh: building it is the first collective, where ranks with different layouts would hang.
    check_agreement(model, dist_config)
    check_context_parallel(model, ParallelConfig.from_dict(dist_config))
    mesh = build_mesh(dist_config)
    config = ParallelConfig.from_dict(dist_config, world_size=dist.get_world_size())
    if parallel_state(model) is not None:
        raise ValueError(f"this {type(model).__name__} is already parallelized; build a fresh model")
    tp = config.tensor_parallel_size
    known = plan_for(model) if plan is None else None
    if known is not None:  # an unmodified HF model of a supported family
        known.check(tp)
        plan, divide = known.plan, {**known.divide, **(divide or {})}
    whole = whole_modules(model, dict(config.parts))
    if config.expert_parallel_size > 1:
        whole |= expert_module_paths(model)
    entries = keep_whole(merge_plans(component_plan(model), name_plan(model, plan) if plan else []), whole)
    if tp > 1:
        if not entries:
            raise ConfigError(
                f"tensor_parallel_size={tp} but {type(model).__name__} declares no tensor-parallel plan",
                "tensor_parallel_size",
            )
        check_tensor_parallel(model, entries, tp, whole)
    if config.context_parallel_size > 1:  # hooks on the modules themselves: pipeline stages keep them
        apply_context_parallel(model, mesh["cp"])
    check_expert_parallel(model, config)
    if config.pipeline_parallel_size > 1:
        # Imported here: the pipeline module builds on this one's ParallelState.
        from brickwork.parallel.pipeline_model import parallelize_pipeline

        return parallelize_pipeline(model, config, mesh, plan, divide)
    device = mesh_device(mesh)
    meta = uses_meta_init(model, device)
    if meta and config.expert_parallel_size > 1:
        raise ConfigError(
            "expert parallel needs the real model on every rank (no meta-device init yet)",
            "expert_parallel_size",
        )
    source = take_source(model, device) if meta else {}
    if not meta:
        model.to(device)
    if tp > 1:
        apply_tensor_parallel(
            model,
            entries,
            mesh["tp"],
            sequence_parallel=config.sequence_parallel,
            divide=divide,
            vocab_multiple=config.vocab_multiple,
            whole=whole,
        )
        if source:
            source = pad_source(model, source)
    apply_activation_checkpointing(model, config.activation_checkpointing)
    experts = ExpertParallel(model, config, mesh) if config.expert_parallel_size > 1 else None
    ddps = []
    replicas = data_mesh(mesh)
    if config.zero_stage >= 2:
        apply_fsdp(model, config, replicas, experts)
        if meta:
            materialize(model, source, device)
    else:
        if meta:
            materialize(model, source, device)
        if replicas.size() > 1:
            ddps.append(attach_ddp(model, replicas, ignore=experts.parameters() if experts else ()))
        if experts is not None and experts.mesh["edp"].size() > 1:
            ddps += [attach_ddp(bank, experts.mesh["edp"]) for bank in experts.banks.values()]
    state = ParallelState(config, mesh, [model], ddps, experts)
    setattr(model, STATE_ATTR, state)
    if ddps and isinstance(ddps[0].module, LocalShards):
        # The optimizer must step the shards DDP reduces, not the DTensor views the modules hold.
        model.__class__ = type(type(model).__name__, (TrainableParameters, type(model)), {})
    return model


def mesh_device(mesh: DeviceMesh) -> torch.device:
    """The device this rank computes on."""
    index = torch.cuda.current_device() if mesh.device_type == "cuda" else None
    return torch.device(mesh.device_type, index)


def attach_ddp(
    module: nn.Module,
    dp_mesh: DeviceMesh,
    accumulates: bool = False,
    ignore: Sequence[nn.Parameter] = (),
) -> DistributedDataParallel:
    """DDP over ``dp_mesh`` driven by hooks on ``module`` itself (torch ``replicate``'s way), so
    ``module`` needs no wrapper; ``ignore``: parameters it leaves alone. Returns the DDP object,
    which holds the reducer."""
    ddp = apply_ddp(module, dp_mesh, accumulates=accumulates, ignore=ignore)

    def before(_: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        DistributedDataParallel._active_ddp_module = ddp
        return ddp._pre_forward(*args, **kwargs)

    def after(_: nn.Module, args: tuple, output: Any) -> Any:
        DistributedDataParallel._active_ddp_module = None
        return ddp._post_forward(output)

    module.register_forward_pre_hook(before, with_kwargs=True)
    module.register_forward_hook(after)
    return ddp


class TrainableParameters:
    """Mixed into a parallelized model's class where the tensors the optimizer steps are not the
    modules' own (DDP + TP: local shards behind DTensor views): ``named_parameters`` yields those,
    under the single-process names."""

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, torch.Tensor]]:
        seen: set[int] = set()
        for name, tensor in parallel_state(self).trainable().items():
            if remove_duplicate and id(tensor) in seen:
                continue
            seen.add(id(tensor))
            yield (f"{prefix}.{name}" if prefix else name), tensor


def parallel_state(model: nn.Module) -> ParallelState | None:
    """The layout ``parallelize`` applied to ``model``, or None for a plain single-process module."""
    return getattr(model, STATE_ATTR, None)


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
        ddps: Sequence[DistributedDataParallel],
        experts: ExpertParallel | None = None,
    ) -> None:
        self.config = config
        self.experts = experts
        self.mesh = mesh
        self.device = mesh_device(mesh)
        self.modules = list(modules)
        self.ddps = list(ddps)
        replicas = data_mesh(mesh)
        self.dp_group, self.data_replicas = replicas.get_group(), replicas.size()
        expert_params = experts.parameters() if experts is not None else ()
        self._zero = ZeroOptimizers(replicas, expert_params) if config.zero_stage == 1 else None
        self.batch_group, self.batch_source = _batch_group(mesh)

    @property
    def is_pipeline(self) -> bool:
        return self.config.pipeline_parallel_size > 1

    def trainable(self) -> dict[str, torch.Tensor]:
        """Each parameter name (tied names too) -> the tensor the optimizer holds for it: the
        parameter, or under DDP + TP its local shard (data_parallel.LocalShards)."""
        out: dict[str, torch.Tensor] = {}
        shards = {id(d.module._model[0]): d.module for d in self.ddps if isinstance(d.module, LocalShards)}
        for module in self.modules:
            local = shards.get(id(module))
            out.update(
                local.by_name if local is not None else module.named_parameters(remove_duplicate=False)
            )
        return out

    def parameters(self) -> list[torch.Tensor]:
        """The tensors the optimizer steps, each once."""
        return list({id(t): t for t in self.trainable().values()}.values())

    def local_state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's state by single-process names: DTensors where sharded, sharing storage."""
        out: dict[str, torch.Tensor] = {}
        for module in self.modules:
            out.update(module.state_dict())
        return out

    def stepped_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer that really steps for ``optimizer``: under ZeRO-1 its ZeroRedundancyOptimizer
        (each rank holding 1/dp of the state), otherwise ``optimizer``."""
        return self._zero.get(optimizer) if self._zero is not None else optimizer

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


def _batch_group(mesh: DeviceMesh) -> tuple[dist.ProcessGroup | None, int]:
    """The group of this rank's pipeline-, context- and tensor-parallel peers (one data-parallel index)
    and its first global rank, which the others take the batch from; (None, rank) when it is this rank
    alone. Context-parallel peers share the batch and each takes its slice of the sequence.

    ``new_group`` is collective, so every rank creates every group, in the same order.
    """
    grid = mesh.mesh  # [pp, dp, cp, tp] global ranks
    me = dist.get_rank()
    if grid.numel() == grid.shape[1]:
        return None, me
    found: tuple[dist.ProcessGroup | None, int] = (None, me)
    for dp_index in range(grid.shape[1]):
        ranks = [int(r) for r in grid[:, dp_index].flatten()]
        group = dist.new_group(ranks)
        if me in ranks:
            found = (group, ranks[0])
    return found


__all__ = ["ParallelState", "parallel_state", "parallelize"]
