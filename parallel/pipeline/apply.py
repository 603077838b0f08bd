"""``apply_pipeline``: the model cut into stages, each laid out like a whole model would be.

Each rank builds its stages (parallel/pipeline/stages.py): pipeline rank r holds stages r, r + pp, ...
(v of them under ``interleaved_1f1b``). Every stage gets tensor parallel from the model's plan,
activation checkpointing, then DDP or FSDP2 over the data-parallel ranks, and is driven by the
schedule of :class:`~brickwork.parallel.pipeline.model.PipelinedModel`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from brickwork.errors import ConfigError
from brickwork.layout import PlanValue
from brickwork.parallel.activation_checkpointing import apply_activation_checkpointing
from brickwork.parallel.compile import apply_compile
from brickwork.parallel.config import ParallelConfig
from brickwork.parallel.data.ddp import attach_ddp
from brickwork.parallel.data.fsdp import apply_fsdp
from brickwork.parallel.materialize import uses_meta_init
from brickwork.parallel.mesh import data_mesh, mesh_device
from brickwork.parallel.pipeline.model import PipelinedModel, PipelineState
from brickwork.parallel.pipeline.stages import (
    PipelineStageModule,
    build_stage_modules,
    shared_parameters,
    stage_layer_counts,
)
from brickwork.parallel.tensor.apply import TensorParallelPlan, apply_tensor_parallel, tensor_parallel_plan
from brickwork.parallel.tensor.parts import whole_modules


def check_pipeline(model: nn.Module, mesh: DeviceMesh) -> None:
    """ConfigError unless ``model`` can be cut into stages: no ``part`` annotations, and the real
    model on every rank. Collective (the meta-device check), so a rank that passed a meta model does
    not fail alone."""
    annotated = whole_modules(model, {})
    if annotated:  # the dist dict's parts are refused by ParallelConfig already
        raise ConfigError(
            f"{sorted(annotated)[0]} is kept whole by a part annotation; per-part strategies are not "
            "supported under a pipeline yet",
            "pipeline_parallel_size",
        )
    if uses_meta_init(model, mesh_device(mesh)):
        raise ConfigError(
            "a model on the meta device is not supported with pipeline_parallel_size > 1: every rank builds "
            "the real model and keeps only its stages",
            "pipeline_parallel_size",
        )


def apply_pipeline(
    model: nn.Module,
    mesh: DeviceMesh,
    config: ParallelConfig,
    *,
    plan: Mapping[str, PlanValue] | None = None,
    divide: Mapping[str, Sequence[str]] | None = None,
    compile: bool = False,
) -> PipelinedModel:
    """This rank's stages of ``model``, each laid out over "tp" and the data-parallel ranks, with their
    schedule; ``plan`` and ``divide`` as ``apply_tensor_parallel`` takes them, for the whole model;
    ``compile``: each stage's layers (and the last stage's head) compiled as regions (parallel/compile.py)."""
    check_pipeline(model, mesh)
    layout = tensor_parallel_plan(model, config, plan, divide)
    counts = stage_layer_counts(model, config)
    shared = shared_parameters(model, counts)
    pp, pp_rank = config.pipeline_parallel_size, mesh["pp"].get_local_rank()
    stage_ids = [pp_rank + k * pp for k in range(config.virtual_pipeline_size)]
    stages = build_stage_modules(model, counts, stage_ids)
    roots = [_lay_out(stage, mesh, config, layout, compile) for stage in stages]
    state = PipelineState(config, mesh, stages, roots, shared)
    return PipelinedModel(stages, roots, state, list(model.state_dict()), getattr(model, "spec", None))


def _lay_out(
    stage: PipelineStageModule,
    mesh: DeviceMesh,
    config: ParallelConfig,
    layout: TensorParallelPlan,
    compile: bool,
) -> nn.Module:
    """Tensor parallel, activation checkpointing and data parallel on one stage; returns what the
    ``PipelineStage`` drives (the DDP object under DDP, else the stage)."""
    stage.to(mesh_device(mesh))
    names = [name for name, _ in stage.named_modules()]
    # Patterns were checked against the whole model; a stage takes those that match its modules.
    own_plan = {p: s for p, s in layout.patterns.items() if fnmatch.filter(names, p)}
    own_divide = {p: a for p, a in layout.divide.items() if fnmatch.filter(names, p)}
    apply_tensor_parallel(stage, mesh, config, plan=own_plan, divide=own_divide, split_input=stage.is_first)
    apply_activation_checkpointing(stage, config)
    if compile:
        apply_compile(stage, config)
    replicas = data_mesh(mesh)
    if config.zero_stage >= 2:
        apply_fsdp(stage, config, replicas)
        return stage
    if replicas.size() > 1:
        return attach_ddp(stage, replicas, accumulates=True)
    return stage
