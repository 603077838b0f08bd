"""What ``parallelize`` returns under a pipeline: this rank's stages and their schedule.

:class:`PipelinedModel` holds this rank's stages (pipeline rank r holds stages r, r + pp, ...) and
builds the schedule (``ScheduleGPipe``, ``Schedule1F1B`` or ``ScheduleInterleaved1F1B`` over the
"pp" process group) for the loss function a train step gives it; it knows no loss itself. A weight
held by two stages (a tied embedding and LM head, on the first and the last stage) has its gradient
summed across them before clipping and the optimizer step (:class:`PipelineState`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
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

from brickwork.parallel.config import ParallelConfig
from brickwork.parallel.data.ddp import named_trainable
from brickwork.parallel.grad_norm import clip_grad_norm, settle_gradients
from brickwork.parallel.mesh import own_group
from brickwork.parallel.pipeline.stages import PipelineStageModule
from brickwork.parallel.state import STATE_ATTR, ParallelState


class PipelineState(ParallelState):
    """The ParallelState of a rank's pipeline stages: tied weights summed over the stages holding
    them, the gradient norm summed over the pipeline. The schedule reduces over dp itself, at the end
    of its last microbatch, so gradient sync needs no switching here."""

    def __init__(
        self,
        config: ParallelConfig,
        mesh: DeviceMesh,
        stages: list[PipelineStageModule],
        roots: list[nn.Module],
        shared: list[dict[int, str]],
    ) -> None:
        ddps = [r for r in roots if isinstance(r, nn.parallel.DistributedDataParallel)]
        super().__init__(config, mesh, stages, ddps)
        self.stages, self.roots = stages, roots
        self.pp_group = mesh["pp"].get_group()
        self.ties = self._tie_groups(shared)
        self.duplicates = [param for param, _, counted in self.ties if not counted]

    def set_gradient_sync(self, enabled: bool) -> None:
        """Nothing to switch: the schedule syncs on its last microbatch only."""

    def finish_gradients(self) -> None:
        settle_gradients(self.parameters())
        with torch.no_grad():
            # The copies sit at the same (dp, tp) place, so their local gradient shards line up.
            for param, group, _ in self.ties:
                grad = param.grad.to_local() if isinstance(param.grad, DTensor) else param.grad
                dist.all_reduce(grad, group=group)

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        return clip_grad_norm(self.parameters(), max_norm, [self.pp_group], duplicates=self.duplicates)

    def _tie_groups(self, shared: list[dict[int, str]]) -> list[tuple[torch.Tensor, dist.ProcessGroup, bool]]:
        """For each weight held by several stages, this rank's copy (if any), the group of ranks that
        hold it at this rank's (dp, cp, tp) place, and whether this copy counts in the gradient norm."""
        pp = self.config.pipeline_parallel_size
        grid = self.mesh.mesh  # [pp, dp, cp, tp] global ranks
        trainable = self.trainable()
        held_here = {s.stage_index for s in self.stages}
        ties = []
        for held in shared:
            pp_ranks = sorted({s % pp for s in held})
            places = itertools.product(*map(range, grid.shape[1:]))  # each (dp, cp, tp) place
            group = own_group([int(grid[(r, *place)]) for r in pp_ranks] for place in places)
            # Stages on one rank share the very tensor (an encoder-decoder's embedding on its first
            # stage and again where the decoder starts): it is reduced once per rank.
            here = {s: name for s, name in held.items() if s in held_here}
            if here:
                ties.append((trainable[next(iter(here.values()))], group, min(held) in here))
        return ties


class PipelinedModel(nn.Module):
    """This rank's pipeline stages and their schedule: what ``parallelize`` returns under a pipeline.

    ``stages`` register the model's own modules under their own names, so ``full_state_dict`` and
    checkpoints use the single-process names. ``model(x)`` runs the forward of the whole batch through
    the pipeline and returns the full output on every rank. A train step calls :meth:`run_schedule`.
    """

    def __init__(
        self,
        stages: list[PipelineStageModule],
        roots: list[nn.Module],
        state: PipelineState,
        key_order: list[str],
        spec: dict[str, Any] | None,
    ) -> None:
        super().__init__()
        self.stages = nn.ModuleList(stages)
        self._roots = roots
        self.key_order = key_order
        self.spec = spec
        setattr(self, STATE_ATTR, state)
        self.has_first = any(s.is_first for s in stages)
        self.last = next((s for s in stages if s.is_last), None)
        # PipelineStages infer the shapes they exchange on their first step, so each input shape gets
        # its own stages and schedule; the last train step's stages stay in ``pipeline_stages``.
        self._schedules: dict[tuple, Any] = {}
        self.pipeline_stages: list[PipelineStage] = []

    @property
    def state(self) -> PipelineState:
        return getattr(self, STATE_ATTR)

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """This rank's trainable tensors under the single-process names (the stages' own names)."""
        return named_trainable(self.state.trainable(), prefix, remove_duplicate)

    def _pipeline_stages(self) -> list[PipelineStage]:
        state = self.state
        return [
            PipelineStage(root, stage.stage_index, stage.num_stages, state.device, group=state.pp_group)
            for stage, root in zip(self.stages, self._roots)
        ]

    def full_output(self, local: torch.Tensor) -> torch.Tensor:
        """The last stage's output as the model would give it: a DTensor again where TP split it."""
        layout = self.last.output_layout if self.last is not None else None
        if layout is None:
            return local
        mesh, placements, shape, stride = layout
        return DTensor.from_local(local, mesh, placements, run_check=False, shape=shape, stride=stride)

    def run_schedule(
        self,
        inputs: torch.Tensor,
        target: torch.Tensor,
        microbatches: int,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        extras: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        """Forward and backward of ``inputs`` [B, ...] in ``microbatches`` equal microbatches.

        ``extras`` (each [B, ...]: an ``attention_mask``, ``token_type_ids``, ``decoder_input_ids``)
        reach every stage as keyword arguments, split into the same microbatches.
        ``loss_fn(output, target_microbatch)`` runs on the last stage (output as :meth:`full_output`
        gives it); its value is back-propagated as it is (no scaling by the microbatch count).
        ValueError, on every rank, when B does not split into the microbatches.
        """
        if inputs.shape[0] % microbatches:
            raise ValueError(
                f"this data-parallel rank's batch of {inputs.shape[0]} rows does not split into "
                f"{microbatches} pipeline microbatches (num_microbatches × grad_accum_steps)"
            )
        extras = self._on_device(extras)
        key = ("train", _shapes(inputs, extras), microbatches)
        if key not in self._schedules:
            stages = self._pipeline_stages()
            self._schedules[key] = (stages, self._schedule(stages, microbatches))
        self.pipeline_stages, schedule = self._schedules[key]
        self._loss_fn = loss_fn
        args = (inputs.to(self.state.device),) if self.has_first else ()
        kwargs = {"target": target.to(self.state.device)} if self.last is not None else {}
        schedule.step(*args, return_outputs=False, **kwargs, **extras)

    def _on_device(self, extras: Mapping[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
        return {k: v.to(self.state.device) for k, v in (extras or {}).items()}

    def _schedule(self, stages: list[PipelineStage], microbatches: int) -> Any:
        def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return self._loss_fn(self.full_output(output), target)

        name = self.state.config.pipeline_schedule
        if name == "interleaved_1f1b":
            return ScheduleInterleaved1F1B(stages, microbatches, loss_fn=loss, scale_grads=False)
        schedule = ScheduleGPipe if name == "gpipe" else Schedule1F1B
        return schedule(stages[0], microbatches, loss_fn=loss, scale_grads=False)

    @torch.no_grad()
    def forward(self, inputs: torch.Tensor, **extras: torch.Tensor) -> torch.Tensor:
        """The whole batch through the pipeline -> the full output (gathered over TP), on every rank.

        ``extras`` are the batch's other inputs (masks, decoder ids), given to every stage."""
        inputs = inputs.to(self.state.device)
        extras = self._on_device(extras)
        key = ("forward", _shapes(inputs, extras))
        if key not in self._schedules:
            stages = self._pipeline_stages()
            self._schedules[key] = (
                ScheduleGPipe(stages[0], 1) if len(stages) == 1 else ScheduleLoopedBFS(stages, 1)
            )
        schedule = self._schedules[key]
        output = schedule.step(inputs, **extras) if self.has_first else schedule.step(**extras)
        result = None
        if self.last is not None:
            result = self.full_output(output)
            result = (result.full_tensor() if isinstance(result, DTensor) else result).detach()
        box = [result]
        pp = self.state.config.pipeline_parallel_size
        dist.broadcast_object_list(box, group=self.state.pp_group, group_src=pp - 1)
        return box[0].to(self.state.device)


def _shapes(inputs: torch.Tensor, extras: Mapping[str, torch.Tensor]) -> tuple:
    """What a schedule's stages are built for: the shapes and dtypes of the inputs they take."""
    return tuple((k, tuple(v.shape), v.dtype) for k, v in [("", inputs), *sorted(extras.items())])
