"""``apply_data_parallel``: replicas over the data-parallel ranks, by ``zero_stage``.

| zero_stage | engine                                                      |
|------------|-------------------------------------------------------------|
| 0          | DistributedDataParallel (data/ddp.py)                       |
| 1          | DistributedDataParallel + ZeroRedundancyOptimizer (zero.py) |
| 2          | FSDP2 ``fully_shard(reshard_after_forward=False)`` (fsdp.py)|
| 3          | FSDP2 ``fully_shard`` (parameters resharded after forward)  |

The replicas are the "dp" ranks, times the "cp" ranks under context parallel (each sees other
positions of the same sequences). Under expert parallel each bank of experts is replicated over the
ranks that hold the same experts only ("edp").
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from brickwork.parallel.config import ParallelConfig
from brickwork.parallel.data.ddp import LocalShards, attach_ddp, train_local_shards
from brickwork.parallel.data.fsdp import apply_fsdp
from brickwork.parallel.materialize import MetaSource
from brickwork.parallel.state import layout_state


def apply_data_parallel(
    model: nn.Module, mesh: DeviceMesh, config: ParallelConfig, *, source: MetaSource | None = None
) -> nn.Module:
    """Replicate ``model`` (already laid out over "tp" and the experts) over its data-parallel ranks,
    in place, and attach its ParallelState (what ``TrainStep`` reads); returns ``model``.

    ``source``: where the model was built on the meta device, rank 0's weights, which fill the local
    shards once they have their final layout (after FSDP2 shards them, before DDP broadcasts them).
    """
    state = layout_state(model, mesh, config)
    experts = state.experts
    if config.zero_stage >= 2:
        apply_fsdp(model, config, state.replicas, experts)
        if source is not None:
            source.fill(model)
        return model
    if source is not None:
        source.fill(model)
    if state.replicas.size() > 1:
        ignore = experts.parameters() if experts is not None else ()
        state.ddps.append(attach_ddp(model, state.replicas, ignore=ignore))
    if experts is not None and experts.mesh["edp"].size() > 1:
        state.ddps += [attach_ddp(bank, experts.mesh["edp"]) for bank in experts.banks.values()]
    if state.ddps and isinstance(state.ddps[0].module, LocalShards):
        # The optimizer must step the shards DDP reduces, not the DTensor views the modules hold.
        train_local_shards(model, state.ddps[0].module)
    return model
