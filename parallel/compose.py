"""``parallelize(model, dist)``: the layout applied to the model in place (the contract of DESIGN.md),
as a sequence of steps that each take the model, the mesh and the config and return the model.

The dist dict is validated once, into the :class:`ParallelConfig` every step reads. Each step
checks what it needs before it changes anything, and each is usable on its own: tensor parallel
(tensor/apply.py), context parallel (context_parallel.py), expert parallel (expert_parallel.py),
the pipeline (pipeline/apply.py), activation checkpointing (activation_checkpointing.py) and data
parallel (data/apply.py), which attaches the model's ParallelState (state.py). Nothing here knows a
loss: training is ``brickwork.train.TrainStep``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from torch import nn

from brickwork.errors import ConfigError
from brickwork.layout import PlanValue
from brickwork.parallel.activation_checkpointing import apply_activation_checkpointing
from brickwork.parallel.agreement import check_agreement
from brickwork.parallel.compile import apply_compile, check_compilable
from brickwork.parallel.config import ParallelConfig, WorldSizeError
from brickwork.parallel.context_parallel import apply_context_parallel
from brickwork.parallel.data.apply import apply_data_parallel
from brickwork.parallel.expert_parallel import apply_expert_parallel
from brickwork.parallel.materialize import place_on_device
from brickwork.parallel.mesh import build_mesh, launched_config, start_process_group
from brickwork.parallel.pipeline.apply import apply_pipeline
from brickwork.parallel.state import parallel_state
from brickwork.parallel.tensor.apply import apply_tensor_parallel


def parallelize(
    model: nn.Module,
    dist_config: Mapping[str, Any] | ParallelConfig,
    *,
    plan: Mapping[str, PlanValue] | None = None,
    divide: Mapping[str, Sequence[str]] | None = None,
    compile: bool = False,
) -> nn.Module:
    """Lay ``model`` out over all ranks as the dist dict says, in place; every rank calls it.

    Returns ``model`` itself, whose ``.parameters()`` are now this rank's (shards under TP/FSDP), or
    with ``pipeline_parallel_size`` > 1 a :class:`~brickwork.parallel.pipeline.model.PipelinedModel`
    holding this rank's stages and the schedule. Tensor parallel follows the components' own
    ``tp_plan()`` declarations, plus ``plan`` (glob pattern -> style, or -> {child: style} for an
    owner of children under different parents), whose entries win over a component's entry for the
    same module: that is how a model brickwork did not build is sharded (``divide`` names attributes
    such as head counts to divide by the TP size). HF GPT-2, Llama, GPT-NeoX and BERT models need
    neither: their plans come from parallel/plans/ by model type. Rank 0 may pass the real model
    while the others pass it built on the meta device (parallel/materialize.py), except under a
    pipeline. In a plain ``python`` process this is a world of one.

    ``compile=True`` compiles each layer, and the head and loss, as regions of their own
    (parallel/compile.py), after tensor parallel, expert parallel and activation checkpointing and
    before data parallel; a layout that cannot compile is refused (ConfigError) before anything changes.
    """
    try:
        config = launched_config(dist_config)
    except WorldSizeError as err:
        _refuse_on_every_rank(model, err)
    if parallel_state(model) is not None:
        raise ValueError(f"this {type(model).__name__} is already parallelized; build a fresh model")
    if compile:
        check_compilable(model, config)
    start_process_group(config)
    # Before the mesh: building it is the first collective, where ranks with different layouts would hang.
    check_agreement(model, config)
    mesh = build_mesh(config)
    model = apply_context_parallel(model, mesh, config)  # hooks on the modules: pipeline stages keep them
    if config.pipeline_parallel_size > 1:
        return apply_pipeline(model, mesh, config, plan=plan, divide=divide, compile=compile)
    source = place_on_device(model, mesh)
    model = apply_tensor_parallel(model, mesh, config, plan=plan, divide=divide)
    model = apply_expert_parallel(model, mesh, config)
    model = apply_activation_checkpointing(model, config)
    if compile:
        model = apply_compile(model, config)
    return apply_data_parallel(model, mesh, config, source=source)


def _refuse_on_every_rank(model: nn.Module, err: WorldSizeError) -> NoReturn:
    """Raise ``err``, after joining the agreement check the other ranks are in: a rank whose dist dict
    fits the world would otherwise wait there for this one until ``timeout_s``. Where only some ranks
    got the bad dict, the others raise the agreement's error naming them."""
    start_process_group(err.config)
    with contextlib.suppress(ConfigError):
        check_agreement(model, err.config)
    raise err
