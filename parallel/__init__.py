"""brickwork.parallel: one dist dict -> device mesh, tensor/sequence/context/expert parallel, pipeline
stages, data parallel and ZeRO, and checkpoints that reshard across layouts.

Built on torch's own engine: DeviceMesh, DTensor ``parallelize_module``, ``torch.distributed.pipelining``,
DDP, ``ZeroRedundancyOptimizer``, FSDP2 ``fully_shard`` and ``torch.distributed.checkpoint``.
``parallelize`` (compose.py) is a short sequence of ``apply_*`` steps, each usable on its own. The
layout knows no loss: training is ``brickwork.train.TrainStep``. See docs/parallel.md.
"""

from brickwork.checkpoint import export, is_complete
from brickwork.parallel.activation_checkpointing import apply_activation_checkpointing
from brickwork.parallel.balance import split_rows, split_stages
from brickwork.parallel.checkpoint import load_checkpoint, save_checkpoint
from brickwork.parallel.compose import parallelize
from brickwork.parallel.config import ParallelConfig
from brickwork.parallel.context_parallel import apply_context_parallel
from brickwork.parallel.data.apply import apply_data_parallel
from brickwork.parallel.expert_parallel import apply_expert_parallel
from brickwork.parallel.full_state import full_state_dict
from brickwork.parallel.grad_norm import clip_grad_norm
from brickwork.parallel.launch import RankError, SpawnError, spawn
from brickwork.parallel.mesh import MESH_DIMS, build_mesh
from brickwork.parallel.pipeline.apply import apply_pipeline
from brickwork.parallel.pipeline.model import PipelinedModel
from brickwork.parallel.planner import Plan, estimate, plan
from brickwork.parallel.state import ParallelState, parallel_state
from brickwork.parallel.tensor.apply import apply_tensor_parallel
from brickwork.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from brickwork.parallel.tensor.parts import part
from brickwork.parallel.tensor.plan import PlanEntry, component_plan, name_plan

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
    "apply_activation_checkpointing",
    "apply_context_parallel",
    "apply_data_parallel",
    "apply_expert_parallel",
    "apply_pipeline",
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
    "part",
    "plan",
    "save_checkpoint",
    "spawn",
    "split_rows",
    "split_stages",
]
