"""Pipeline parallel (× data × tensor parallel) with torch.distributed.pipelining, under DESIGN.md's contract.

Each rank builds its stages (parallel/pipeline_stages.py): pipeline rank r holds stages r, r + pp, ...
(v of them under ``interleaved_1f1b``). Every stage is laid out like a whole model would be (tensor
parallel from the plans, activation checkpointing, then DDP or FSDP2 over "dp"), wrapped in a
``PipelineStage`` over the "pp" process group and driven by ``ScheduleGPipe``, ``Schedule1F1B`` or
``ScheduleInterleaved1F1B``. The loss of a microbatch is its summed token cross entropy × dp / (tokens
of the global batch) with ``scale_grads=False``, so the gradients are those of the global mean, as
without a pipeline. A weight held by two stages (a tied embedding and LM head, on the first and the
last stage) has its gradient summed across them before clipping and the optimizer step.
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Callable, Mapping, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleLoopedBFS,
)
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from brickwork.errors import ConfigError
from brickwork.parallel.activation_checkpointing import apply_activation_checkpointing
from brickwork.parallel.config import ParallelConfig
from brickwork.parallel.data_parallel import LocalShards, apply_ddp, apply_fsdp
from brickwork.parallel.grad_norm import clip_grad_norm, settle_gradients
from brickwork.parallel.materialize import uses_meta_init
from brickwork.parallel.mesh import build_mesh
from brickwork.parallel.parallel_model import IGNORE_INDEX, ParallelModel, gather_full_state
from brickwork.parallel.pipeline_stages import (
    PipelineStageModule,
    build_stage_modules,
    shared_parameters,
    stage_layer_counts,
)
from brickwork.parallel.tensor_parallel import apply_tensor_parallel, component_plan, merge_plans, name_plan


def parallelize_pipeline(
    model: nn.Module,
    config: ParallelConfig,
    plan: Mapping[str, str] | None,
    divide: Mapping[str, Sequence[str]] | None,
) -> PipelineParallelModel:
    """The pipeline path of ``parallelize`` (checks on the dist dict and plans are done by then).

    The meta-device check comes first and is collective, so a rank that passed a meta model does
    not fail alone; the stage checks after it give the same answer on every rank.
    """
    mesh = build_mesh(config)
    device = torch.device(
        mesh.device_type, torch.cuda.current_device() if mesh.device_type == "cuda" else None
    )
    if uses_meta_init(model, device):
        raise ConfigError(
            "a model on the meta device is not supported with pipeline_parallel_size > 1: every rank builds "
            "the real model and keeps only its stages",
            "pipeline_parallel_size",
        )
    counts = stage_layer_counts(model, config)
    shared = shared_parameters(model, counts)
    pp, pp_rank = config.pipeline_parallel_size, mesh["pp"].get_local_rank()
    stage_ids = [pp_rank + k * pp for k in range(config.virtual_pipeline_size)]
    stages = build_stage_modules(model, counts, stage_ids)
    roots = [_lay_out(stage, config, mesh, device, plan, divide) for stage in stages]
    return PipelineParallelModel(stages, roots, config, mesh, device, shared, list(model.state_dict()))


def _lay_out(
    stage: PipelineStageModule,
    config: ParallelConfig,
    mesh: DeviceMesh,
    device: torch.device,
    plan: Mapping[str, str] | None,
    divide: Mapping[str, Sequence[str]] | None,
) -> nn.Module:
    """Tensor parallel, activation checkpointing and data parallel on one stage; returns its root."""
    stage.to(device)
    if config.tensor_parallel_size > 1:
        names = [name for name, _ in stage.named_modules()]
        # Patterns were checked against the whole model; a stage takes those that match its modules.
        own_plan = {p: s for p, s in (plan or {}).items() if fnmatch.filter(names, p)}
        own_divide = {p: a for p, a in (divide or {}).items() if fnmatch.filter(names, p)}
        entries = merge_plans(component_plan(stage), name_plan(stage, own_plan))
        apply_tensor_parallel(
            stage,
            entries,
            mesh["tp"],
            sequence_parallel=config.sequence_parallel,
            divide=own_divide,
            split_input=stage.is_first,
        )
    apply_activation_checkpointing(stage, config.activation_checkpointing)
    if config.zero_stage >= 2:
        apply_fsdp(stage, config, mesh["dp"])
        return stage
    if config.data_parallel_size > 1:
        return apply_ddp(stage, mesh["dp"], accumulates=True)
    return stage


class PipelineParallelModel(ParallelModel):
    """A ParallelModel whose ranks each hold pipeline stages; ``module`` is a ModuleList of this
    rank's stages, each registering its parameters under the full model's names."""

    def __init__(
        self,
        stages: list[PipelineStageModule],
        roots: list[nn.Module],
        config: ParallelConfig,
        mesh: DeviceMesh,
        device: torch.device,
        shared: list[dict[int, str]],
        key_order: list[str],
    ) -> None:
        super().__init__(nn.ModuleList(stages), nn.ModuleList(roots), config, mesh)
        self.stages, self.roots, self.device = stages, roots, device
        self._key_order = key_order
        self._pp_group = mesh["pp"].get_group()
        self._has_first = any(s.is_first for s in stages)
        self._last = next((s for s in stages if s.is_last), None)
        self._ties = self._tie_groups(shared)
        self._duplicates = [param for param, _, counted in self._ties if not counted]
        self._scale = 1.0
        # PipelineStages infer the shapes they exchange on their first step, so each batch shape gets
        # its own stages and schedule. The last train step's are kept in pipeline_stages / schedule.
        self._train_schedules: dict[tuple[int, ...], tuple[list[PipelineStage], object]] = {}
        self._forward_schedules: dict[tuple[int, ...], object] = {}
        self.pipeline_stages: list[PipelineStage] = []
        self.schedule: object | None = None

    def _pipeline_stages(self) -> list[PipelineStage]:
        group = self._pp_group
        return [
            PipelineStage(root, stage.stage_index, stage.num_stages, self.device, group=group)
            for stage, root in zip(self.stages, self.roots)
        ]

    def _schedule(self, stages: list[PipelineStage], microbatches: int, loss_fn: Callable) -> object:
        name = self.config.pipeline_schedule
        if name == "interleaved_1f1b":
            return ScheduleInterleaved1F1B(stages, microbatches, loss_fn=loss_fn, scale_grads=False)
        schedule = ScheduleGPipe if name == "gpipe" else Schedule1F1B
        return schedule(stages[0], microbatches, loss_fn=loss_fn, scale_grads=False)

    def _trainable(self, stage: PipelineStageModule, root: nn.Module) -> dict[str, nn.Parameter]:
        inner = root.module if isinstance(root, nn.parallel.DistributedDataParallel) else root
        if isinstance(inner, LocalShards):
            return inner.by_name
        return dict(stage.named_parameters())

    def named_trainable(self) -> dict[str, torch.Tensor]:
        """Parameter name -> the tensor the optimizer holds, for every stage of this rank."""
        out: dict[str, torch.Tensor] = {}
        for stage, root in zip(self.stages, self.roots):
            out.update(self._trainable(stage, root))
        return out

    def _tie_groups(self, shared: list[dict[int, str]]) -> list[tuple[nn.Parameter, dist.ProcessGroup, bool]]:
        """For each weight held by several stages, this rank's copy (if any), the group of ranks that
        hold it at this rank's (dp, tp) place, and whether this copy counts in the gradient norm."""
        pp = self.config.pipeline_parallel_size
        grid = self.mesh.mesh  # [pp, dp, tp] global ranks
        mine = {s.stage_index: self._trainable(s, r) for s, r in zip(self.stages, self.roots)}
        me = dist.get_rank()
        ties = []
        for held in shared:
            pp_ranks = sorted({s % pp for s in held})
            group = None
            # Every rank creates every group, in the same order (new_group is collective).
            for dp_i in range(grid.shape[1]):
                for tp_i in range(grid.shape[2]):
                    ranks = [int(grid[r, dp_i, tp_i]) for r in pp_ranks]
                    new = dist.new_group(ranks)
                    if me in ranks:
                        group = new
            owner = min(held)
            for stage_index, name in held.items():
                if stage_index in mine:
                    ties.append((mine[stage_index][name], group, stage_index == owner))
        return ties

    def _microbatch_loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        layout = self._last.output_layout if self._last is not None else None
        logits = output
        if layout is not None:
            mesh, placements, shape, stride = layout
            logits = DTensor.from_local(output, mesh, placements, run_check=False, shape=shape, stride=stride)
        loss_sum = F.cross_entropy(
            logits.flatten(0, 1).float(), target.flatten(), reduction="sum", ignore_index=IGNORE_INDEX
        )
        return loss_sum * self._scale

    def train_step(
        self, input_ids: torch.Tensor, labels: torch.Tensor, optimizer: torch.optim.Optimizer
    ) -> float:
        """One optimizer step on the global batch through the pipeline schedule; the global mean
        token cross entropy on every rank. This rank's rows (by dp rank) must split into
        ``num_microbatches`` equal microbatches (ValueError otherwise, on every rank)."""
        local_ids, local_labels, tokens = self._local_batch(input_ids, labels)
        m = self.config.microbatches
        if local_ids.shape[0] % m:
            raise ValueError(
                f"each data-parallel rank's {local_ids.shape[0]} rows of the batch of {input_ids.shape[0]} "
                f"are not divisible by num_microbatches={m}"
            )
        key = tuple(local_ids.shape)
        if key not in self._train_schedules:
            stages = self._pipeline_stages()
            self._train_schedules[key] = (stages, self._schedule(stages, m, self._microbatch_loss))
        self.pipeline_stages, self.schedule = self._train_schedules[key]
        optimizer = self.stepped_optimizer(optimizer)
        optimizer.zero_grad(set_to_none=True)
        self._scale = self.config.data_parallel_size / tokens
        losses: list[torch.Tensor] = []  # the schedule fills it with each microbatch's scaled loss
        args = (local_ids,) if self._has_first else ()
        kwargs = {"target": local_labels, "losses": losses} if self._last is not None else {}
        with self._autocast(), self._loss_context():
            self.schedule.step(*args, return_outputs=False, **kwargs)
        settle_gradients(self._params)
        self._sum_tied_gradients()
        if self.config.max_grad_norm is not None:
            clip_grad_norm(
                self._params, self.config.max_grad_norm, [self._pp_group], duplicates=self._duplicates
            )
        optimizer.step()
        total = torch.zeros(1, dtype=torch.float64, device=self.device)
        for loss in losses:
            total += (loss.to_local() if isinstance(loss, DTensor) else loss).detach().double() / self._scale
        dist.all_reduce(total, group=self.mesh["dp"].get_group())
        dist.all_reduce(total, group=self._pp_group)
        return float(total) / tokens

    @torch.no_grad()
    def _sum_tied_gradients(self) -> None:
        # The copies sit at the same (dp, tp) place, so their local gradient shards line up.
        for param, group, _ in self._ties:
            grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
            dist.all_reduce(grad, group=group)

    def _loss_context(self) -> contextlib.AbstractContextManager:
        # Backward runs inside the schedule, so loss-parallel cross entropy covers the whole step.
        return loss_parallel() if self.config.tensor_parallel_size > 1 else contextlib.nullcontext()

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Forward on the whole batch [B, T] through the pipeline -> full logits [B, T, vocab], every rank."""
        input_ids = input_ids.to(self.device)
        key = tuple(input_ids.shape)
        if key not in self._forward_schedules:
            stages = self._pipeline_stages()
            self._forward_schedules[key] = (
                ScheduleGPipe(stages[0], 1) if len(stages) == 1 else ScheduleLoopedBFS(stages, 1)
            )
        schedule = self._forward_schedules[key]
        with self._autocast():
            output = schedule.step(input_ids) if self._has_first else schedule.step()
        logits = None
        if self._last is not None:
            if self._last.output_layout is not None:
                mesh, placements, shape, stride = self._last.output_layout
                output = DTensor.from_local(
                    output, mesh, placements, run_check=False, shape=shape, stride=stride
                ).full_tensor()
            logits = output.detach()
        box = [logits]
        dist.broadcast_object_list(
            box, group=self._pp_group, group_src=self.config.pipeline_parallel_size - 1
        )
        return box[0].to(self.device)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every stage's full weights, gathered over the pipeline, keyed and ordered like the model's."""
        local: dict[str, torch.Tensor] = {}
        for stage in self.stages:
            local.update(gather_full_state(stage))
        parts: list[dict[str, torch.Tensor] | None] = [None] * self.config.pipeline_parallel_size
        dist.all_gather_object(parts, local, group=self._pp_group)
        merged: dict[str, torch.Tensor] = {}
        for part in parts:
            merged.update(part or {})
        return {name: merged[name] for name in self._key_order if name in merged}
