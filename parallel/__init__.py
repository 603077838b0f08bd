"""brickwork.parallel: one dist dict -> device mesh, tensor/sequence parallel, pipeline stages, data
parallel and ZeRO, and checkpoints that reshard across layouts.

Built on torch's own engine: DeviceMesh, DTensor ``parallelize_module``, ``torch.distributed.pipelining``,
DDP, ``ZeroRedundancyOptimizer``, FSDP2 ``fully_shard`` and ``torch.distributed.checkpoint``. The
layout knows no loss: training is ``brickwork.train.TrainStep``. See docs/parallel.md.
"""

from brickwork.parallel.balance import split_rows, split_stages
from brickwork.parallel.checkpoint import is_complete, load_checkpoint, save_checkpoint
from brickwork.parallel.config import ParallelConfig
from brickwork.parallel.export import export
from brickwork.parallel.full_state import full_state_dict
from brickwork.parallel.grad_norm import clip_grad_norm
from brickwork.parallel.launch import RankError, SpawnError, spawn
from brickwork.parallel.mesh import MESH_DIMS, build_mesh
from brickwork.parallel.parallel_model import ParallelState, parallel_state, parallelize
from brickwork.parallel.parts import part
from brickwork.parallel.pipeline_model import PipelinedModel
from brickwork.parallel.plan_by_name import parallelize_module_by_plan
from brickwork.parallel.planner import Plan, estimate, plan
from brickwork.parallel.tensor_parallel import PlanEntry, apply_tensor_parallel, component_plan, name_plan
from brickwork.parallel.tensor_parallel_layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)

__all__ = [
    "MESH_DIMS",
    "ColumnParallelLinear",
    "ParallelConfig",
    "ParallelState",
    "PipelinedModel",
    "Plan",
    "PlanEntry",
    "RankError",
    "RowParallelLinear",
    "SpawnError",
    "VocabParallelEmbedding",
    "apply_tensor_parallel",
    "build_mesh",
    "clip_grad_norm",
    "component_plan",
    "estimate",
    "export",
    "full_state_dict",
    "is_complete",
    "load_checkpoint",
    "name_plan",
    "parallel_state",
    "parallelize",
    "parallelize_module_by_plan",
    "part",
    "plan",
    "save_checkpoint",
    "spawn",
    "split_rows",
    "split_stages",
]
