"""brickwork.parallel: one dist dict -> device mesh, tensor/sequence parallel, data parallel and ZeRO.

Built on torch's own engine: DeviceMesh, DTensor ``parallelize_module``, DDP,
``ZeroRedundancyOptimizer``, FSDP2 ``fully_shard`` and ``loss_parallel``. See docs/parallel.md.
"""

from brickwork.parallel.config import ParallelConfig
from brickwork.parallel.grad_norm import clip_grad_norm
from brickwork.parallel.launch import RankError, SpawnError, spawn
from brickwork.parallel.mesh import MESH_DIMS, build_mesh
from brickwork.parallel.parallel_model import ParallelModel, parallelize
from brickwork.parallel.plan_by_name import parallelize_module_by_plan
from brickwork.parallel.tensor_parallel import PlanEntry, apply_tensor_parallel, component_plan, name_plan

__all__ = [
    "MESH_DIMS",
    "ParallelConfig",
    "ParallelModel",
    "PlanEntry",
    "RankError",
    "SpawnError",
    "apply_tensor_parallel",
    "build_mesh",
    "clip_grad_norm",
    "component_plan",
    "name_plan",
    "parallelize",
    "parallelize_module_by_plan",
    "spawn",
]
