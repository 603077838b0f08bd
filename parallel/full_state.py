"""``full_state_dict(model)``: the full weights of a parallelized model, by the single-process names."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from brickwork.layout.vocab_padding import padded_names
from brickwork.parallel.state import parallel_state
from brickwork.parallel.tensor.styles import packed_names, unpack_full


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full weights with the single-process model's names, as CPU tensors, on every rank.

    DTensors are gathered, packed columns put back, pipeline stages merged, a padded vocabulary's
    padding dropped (brickwork/layout/vocab_padding.py). Collective: every rank calls it. A module that
    ``parallelize`` did not lay out gives its own, its DTensors (Megatron-style layers, a module sharded
    by ``apply_tensor_parallel`` alone) gathered.
    """
    state = parallel_state(model)
    if state is None:
        return gather_full_state(model)
    local: dict[str, torch.Tensor] = {}
    for module in state.modules:
        local.update(gather_full_state(module))
    if state.experts is not None:
        local = state.experts.gather_full_state(local)
    if not state.is_pipeline:
        return local
    parts: list[dict[str, torch.Tensor] | None] = [None] * state.config.pipeline_parallel_size
    dist.all_gather_object(parts, local, group=state.mesh["pp"].get_group())
    merged = {name: value for part in parts for name, value in (part or {}).items()}
    order = getattr(model, "key_order", list(merged))
    return {name: merged[name] for name in order if name in merged}


def gather_full_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """``module``'s state dict as full CPU tensors (DTensors gathered, packed columns put back, padded
    vocabulary rows dropped).

    Collective over the meshes of its DTensors: every rank holding a part of ``module`` calls it.
    """
    packed = packed_names([module])
    padded = padded_names([module])
    out = {}
    for name, value in module.state_dict().items():
        if isinstance(value, DTensor):
            value = value.full_tensor()
        if name in packed:
            value = unpack_full(value, packed[name][0], packed[name][1].to(value.device))
        if name in padded:
            value = padded[name].unpad(value)
        out[name] = value.detach().cpu().clone()
    return out
