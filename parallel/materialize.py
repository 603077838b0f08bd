"""Models too big for one device: built on the meta device, parallelized, then only local shards filled.

Rank 0 builds the model for real (its full weights are the seed state dict, in host memory); every
other rank builds the same model under ``torch.device("meta")``, which allocates nothing. After the
layout is applied on meta tensors, each rank allocates its own shards and receives their values
from rank 0 by torch's ``set_model_state_dict(..., broadcast_from_rank0=True)``. So a seed gives the
same full weights as a single-process build, exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh

from brickwork.errors import ConfigError
from brickwork.layout.vocab_padding import unpadded_state_dict
from brickwork.parallel.mesh import mesh_device
from brickwork.parallel.tensor.styles import packed_names
from brickwork.parallel.tensor.vocab_padding import pad_source


@dataclass(frozen=True)
class MetaSource:
    """Rank 0's full weights (empty on the other ranks) for a model that some rank built on the meta
    device, and the device this rank's shards go to once the layout is applied."""

    state: dict[str, torch.Tensor]
    device: torch.device

    def fill(self, model: nn.Module) -> None:
        """Allocate ``model``'s local shards and fill them from rank 0 (a padded vocabulary padded)."""
        materialize(model, pad_source(model, self.state) if self.state else {}, self.device)


def place_on_device(model: nn.Module, mesh: DeviceMesh) -> MetaSource | None:
    """Move ``model`` to this rank's device; or, where some rank passed it on the meta device, leave
    every rank's parameters on meta and return what :meth:`MetaSource.fill` needs after the layout.
    Collective; every rank raises if rank 0 passed a meta model."""
    device = mesh_device(mesh)
    if not uses_meta_init(model, device):
        model.to(device)
        return None
    return MetaSource(take_source(model, device), device)


def uses_meta_init(model: nn.Module, device: torch.device) -> bool:
    """Whether some rank passed a meta model. Collective; every rank raises if rank 0 did."""
    is_meta = any(t.is_meta for t in (*model.parameters(), *model.buffers()))
    flags = torch.tensor([int(is_meta), int(is_meta and dist.get_rank() == 0)], device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    if flags[1]:
        raise ConfigError(
            "rank 0 passed a model on the meta device; rank 0 must build the real model (its weights are "
            "broadcast), the other ranks may build it under torch.device('meta')"
        )
    return bool(flags[0])


def take_source(model: nn.Module, device: torch.device) -> dict[str, torch.Tensor]:
    """Keep rank 0's full state dict (a padded vocabulary's real rows), leave its parameters on meta like
    the others', share buffers.

    Buffers (rotary tables, ALiBi slopes...) are small and may not be in the state dict, so every
    rank gets rank 0's real ones now, before tensor parallel slices any of them.
    """
    rank = dist.get_rank()
    # The real rows of a vocabulary the model padded itself: the layout may pad it another way.
    source = {k: v.detach() for k, v in unpadded_state_dict(model).items()} if rank == 0 else {}
    meta: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if id(param) not in meta:
                meta[id(param)] = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
            module.register_parameter(name, meta[id(param)])
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer is None:
                continue
            real = buffer.to(device) if rank == 0 else torch.empty_like(buffer, device=device)
            dist.broadcast(real, src=0)
            module._buffers[name] = real
    return source


def materialize(model: nn.Module, source: dict[str, torch.Tensor], device: torch.device) -> None:
    """Allocate this rank's shards of the (parallelized) meta model and fill them from rank 0's source."""
    buffers = [
        (module, name, buffer) for module in model.modules() for name, buffer in module._buffers.items()
    ]
    model.to_empty(device=device)
    for module, name, buffer in buffers:
        if buffer is not None:
            module._buffers[name] = buffer
    if source:
        source = dict(source)
        for key, (dim, order) in packed_names([model]).items():
            source[key] = source[key].index_select(dim, order)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, source, options=options)
