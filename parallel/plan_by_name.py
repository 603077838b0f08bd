"""Shard a model brickwork did not build, by glob patterns over its module names (ColossalAI's idea)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from brickwork.parallel.tensor_parallel import PlanValue, apply_tensor_parallel, name_plan


def parallelize_module_by_plan(
    module: nn.Module,
    plan: Mapping[str, PlanValue],
    mesh: DeviceMesh,
    divide: Mapping[str, Sequence[str]] | None = None,
) -> nn.Module:
    """Apply ``plan`` (``{"transformer.h.*.mlp.c_fc": "colwise", ...}``) over the 1-D ``mesh``, in place.

    Styles: colwise, colwise:N (N packed output segments, e.g. a fused q|k|v), rowwise, vocab,
    replicate. ``divide`` names integer attributes (head counts, split sizes) to divide by the TP
    size, by module-name pattern. For a whole training setup use ``parallelize(model, dist, plan=...)``.
    """
    apply_tensor_parallel(module, name_plan(module, plan), mesh, divide=divide)
    return module
