"""Distributed checkpoints with torch.distributed.checkpoint (DCP), loadable under any other layout.

The folder a save writes is described in brickwork/checkpoint/folder.py; the tensors are named by the
single-process model's names. Sharded tensors are saved as DTensors, so DCP records their global
shape and each rank's chunk; loading under another layout reads exactly the chunks each rank now
holds (resharding). A packed ``colwise:N`` parameter, whose columns are reordered for one TP size, is
saved in the single-process order, one chunk per piece (parallel/checkpoint/packed_shards.py). Rank 0
writes ``meta.json``, the manifest and ``.complete`` after every rank has finished.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.tensor import DTensor, distribute_tensor

from brickwork.checkpoint.folder import (
    COMPLETE_MARKER,
    META_FILE,
    UNLISTED,
    mark_complete,
    open_checkpoint,
    quiet_single_process,
    reading,
)
from brickwork.checkpoint.manifest import CorruptCheckpointError, write_manifest
from brickwork.checkpoint.safe_reader import SafeLoadPlanner
from brickwork.layout.vocab_padding import VocabPadding, padded_names
from brickwork.parallel.checkpoint.packed_shards import natural_order_view
from brickwork.parallel.state import parallel_state
from brickwork.parallel.tensor.styles import packed_names


def save_checkpoint(
    directory: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    step: int,
    *,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Save model, optimizer state, step, RNG, spec and dist dict into ``directory``; every rank calls it.

    ``model`` is what ``parallelize`` returned or, in a single process, a plain module. ``extra`` must be JSON
    data. An existing checkpoint in ``directory`` loses its marker first, so a save interrupted
    while overwriting it is not mistaken for complete. Returns the folder.
    """
    pending = prepare_save(directory, model, optimizer, step, extra)
    with quiet_single_process():
        dcp.save(pending.state, checkpoint_id=pending.folder, no_dist=not dist.is_initialized())
    _barrier()
    pending.finish()
    _barrier()
    return pending.folder


@dataclass(frozen=True)
class PendingSave:
    """A save begun by :func:`prepare_save`: the ``state`` DCP is to write into ``folder``, and the
    ``meta`` rank 0 writes once every rank's files are there."""

    folder: Path
    state: dict[str, Any]
    meta: dict[str, Any]

    def finish(self) -> Path:
        """On rank 0, write ``meta.json``, the manifest and ``.complete``; the caller makes sure that
        every rank's DCP files and RNG file are written first."""
        if _rank_and_world()[0] == 0:
            (self.folder / META_FILE).write_text(json.dumps(self.meta, indent=1, sort_keys=True))
            write_manifest(self.folder, skip=UNLISTED)
            mark_complete(self.folder)
        return self.folder


def prepare_save(
    directory: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    step: int,
    extra: Mapping[str, Any] | None,
) -> PendingSave:
    """Everything of a save but the DCP write and the finish: rank 0 clears the marker of an earlier
    save into ``directory``; every rank writes its RNG state and gathers its state dict (views of the
    model's and optimizer's tensors: they must not change until DCP has written or copied them)."""
    folder = Path(directory)
    rank, world = _rank_and_world()
    if rank == 0:
        (folder / COMPLETE_MARKER).unlink(missing_ok=True)
        (folder / "rng").mkdir(parents=True, exist_ok=True)
    _barrier()
    state = {f"model.{k}": v for k, v in _model_state(model)[0].items()}
    if optimizer is not None:
        state.update(_optimizer_state(model, optimizer))
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    torch.save(rng, folder / "rng" / f"rank{rank}.pt")
    meta = {
        "step": step,
        "world_size": world,
        "spec": getattr(model, "spec", None),
        "dist": _dist_dict(model),
        "param_groups": _hyperparameters(optimizer) if optimizer is not None else None,
        "extra": dict(extra or {}),
    }
    return PendingSave(folder, state, meta)


def load_checkpoint(
    directory: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    verify: bool = True,
) -> dict[str, Any]:
    """Load a complete checkpoint into ``model`` (and ``optimizer``), under this run's layout.

    Every rank calls it. Restores weights, optimizer state and hyperparameters, and this rank's RNG
    (rank r takes the RNG of saved rank r mod the saved world size). Returns ``meta.json``: ``step``,
    ``spec``, ``dist``, ``world_size``, ``param_groups``, ``extra``. Raises FileNotFoundError for a
    folder whose save did not finish, UnsafeCheckpointError for metadata that names anything but
    DCP's own classes, and CorruptCheckpointError, naming the file, for anything else it cannot read
    (files that do not match the manifest, or files rewritten together with it). ``verify=False``
    skips the manifest check (it reads every byte) for a folder the caller has just checked.
    """
    folder, meta, reader, stored = open_checkpoint(directory, verify=verify)
    model_state, copies = _model_state(model)
    state: dict[str, Any] = {f"model.{k}": v for k, v in model_state.items()}
    missing = [k for k in state if k not in stored]
    if missing:
        raise CorruptCheckpointError(f"{folder} has no weights for {[k[6:] for k in missing]}")
    destinations = _optimizer_destinations(model, optimizer, stored) if optimizer is not None else {}
    state.update({key: d.tensor for key, d in destinations.items()})
    with reading(folder), quiet_single_process():
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=not dist.is_initialized())
    for name, (param, padding) in copies.items():
        _write_back(param, padding.pad(state[f"model.{name}"]))
    for d in destinations.values():
        if d.copied_from is not None:
            _write_back(d.kept, d.copied_from.pad(d.tensor))
        value = d.kept
        if isinstance(value, DTensor) and not isinstance(d.param, DTensor):
            value = value.to_local()  # a LocalShards shard keeps plain local state
        _local_optimizer(model, optimizer).state[d.param][d.name] = value
    if optimizer is not None and meta.get("param_groups"):
        _restore_hyperparameters(optimizer, meta["param_groups"])
    rank, _ = _rank_and_world()
    rng_file = folder / "rng" / f"rank{rank % meta['world_size']}.pt"
    with reading(rng_file):
        rng = torch.load(rng_file, weights_only=True)
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
    return meta


def _model_state(
    model: nn.Module,
) -> tuple[dict[str, torch.Tensor], dict[str, tuple[torch.Tensor, VocabPadding]]]:
    """The model's state dict, by single-process names: DTensors where sharded, sharing storage with
    the parameters (so DCP loads in place); a padded vocabulary by its real rows, a packed
    ``colwise:N`` parameter in the single-process column order (parallel/checkpoint/packed_shards.py).

    Also, by name, (tensor, padding) of each padded tensor whose real rows no view shows (FSDP's
    shards of the rows): its entry is a gathered copy of them, which a load writes back.
    """
    state = parallel_state(model)
    local = model.state_dict() if state is None else state.local_state_dict()
    padded, packed = _reordered(model)
    out, copies = {}, {}
    for name, value in local.items():
        value = _unwrapped(value)
        if name in padded:
            out[name] = _real_rows(padded[name], value)
            if not padded[name].has_view(value):
                copies[name] = (value, padded[name])
        else:
            out[name] = natural_order_view(value, *packed[name]) if name in packed else value
    return out, copies


def _unwrapped(value: torch.Tensor) -> torch.Tensor:
    """The plain tensor inside a tensor subclass that wraps exactly one (torchao's float8-gathering
    FSDP weight, and the optimizer state made like it), in its DTensor where it was one; sharing its
    storage, so a load fills the subclass. A checkpoint holds plain tensors only: its reader refuses
    other classes, since unpickling them could run code."""
    local = value._local_tensor if isinstance(value, DTensor) else value
    if type(local) is torch.Tensor or not hasattr(local, "__tensor_flatten__"):
        return value
    names, _ = local.__tensor_flatten__()
    inner = getattr(local, names[0]) if len(names) == 1 else None
    if type(inner) is not torch.Tensor or inner.shape != local.shape:
        return value
    if not isinstance(value, DTensor):
        return inner
    return DTensor.from_local(
        inner, value.device_mesh, value.placements, run_check=False, shape=value.shape, stride=value.stride()
    )


def _real_rows(padding: VocabPadding, value: torch.Tensor) -> torch.Tensor:
    """The real rows of a padded tensor: a view of them, or where there is none (:meth:`VocabPadding.
    has_view`) a copy of them gathered from every rank (collective), replicated."""
    if padding.has_view(value):
        return padding.unpadded_view(value)
    return padding.unpad(value.full_tensor() if isinstance(value, DTensor) else value).clone()


def _write_back(target: torch.Tensor, full: torch.Tensor) -> None:
    """Copy the whole padded ``full`` into ``target``, a DTensor: this rank's part of it, as laid out."""
    mesh, placements = target.device_mesh, target.placements
    local = distribute_tensor(full.to(target.device), mesh, placements, src_data_rank=None).to_local()
    target.to_local().copy_(local)


def _reordered(
    model: nn.Module,
) -> tuple[dict[str, VocabPadding], dict[str, tuple[int, torch.Tensor]]]:
    """By name, the padded vocabularies and the packed ``colwise:N`` parameters of ``model``."""
    state = parallel_state(model)
    modules = state.modules if state is not None else [model]
    return padded_names(modules), packed_names(modules)


def _dist_dict(model: nn.Module) -> dict[str, Any] | None:
    state = parallel_state(model)
    return state.config.to_dict() if state is not None else None


def _trainable(model: nn.Module) -> dict[str, torch.Tensor]:
    state = parallel_state(model)
    if state is not None:
        return state.trainable()
    return dict(model.named_parameters(remove_duplicate=False))


def _local_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    # Under ZeRO-1 this rank's state lives in its part of the ZeroRedundancyOptimizer.
    state = parallel_state(model)
    stepped = state.stepped_optimizer(optimizer) if state is not None else optimizer
    return getattr(stepped, "optim", stepped)


def _as_global(value: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """Optimizer state of a LocalShards shard (a plain local tensor) as the DTensor it is a piece of."""
    spec = getattr(param, "_st_info", None)
    if spec is None or isinstance(value, DTensor) or value.shape != param.shape:
        return value
    return DTensor.from_local(
        value, spec.mesh, spec.placements, run_check=False, shape=spec.shape, stride=spec.stride
    )


def _optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    local = _local_optimizer(model, optimizer)
    padded, packed = _reordered(model)
    out = {}
    for name, param in _trainable(model).items():
        for key, value in local.state.get(param, {}).items():
            if isinstance(value, torch.Tensor):
                value = _as_global(_unwrapped(value), param)
                if name in padded and value.shape == _param_shape(param):
                    value = _real_rows(padded[name], value)
                elif name in packed and value.shape == _param_shape(param):
                    value = natural_order_view(value, *packed[name])
                out[f"optim.{name}.{key}"] = value
    return out


def _param_shape(param: torch.Tensor) -> torch.Size:
    """The global shape of ``param`` (a LocalShards shard's is its DTensor's)."""
    spec = getattr(param, "_st_info", None)
    return torch.Size(spec.shape) if spec is not None else param.shape


@dataclass(frozen=True)
class _Destination:
    """Where one optimizer state tensor of a checkpoint loads: ``param``'s state ``name``. DCP fills
    ``tensor``, an empty tensor laid out like the parameter; the optimizer keeps ``kept``: the same, or
    for a padded vocabulary the padded one that ``tensor`` is a view of, or, where there is no view, a
    copy of (``copied_from``, the padding, which the load writes back through)."""

    param: torch.Tensor
    name: str
    tensor: torch.Tensor
    kept: torch.Tensor
    copied_from: VocabPadding | None = None


def _optimizer_destinations(
    model: nn.Module, optimizer: torch.optim.Optimizer, stored: Mapping[str, Any]
) -> dict[str, _Destination]:
    """A :class:`_Destination` for each optimizer state tensor in the checkpoint that this rank's
    optimizer holds."""
    local = _local_optimizer(model, optimizer)
    owned = {id(p) for group in local.param_groups for p in group["params"]}
    padded, packed = _reordered(model)
    out: dict[str, _Destination] = {}
    done: set[int] = set()
    for name, param in _trainable(model).items():
        prefix = f"optim.{name}."
        keys = [k for k in stored if k.startswith(prefix) and "." not in k[len(prefix) :]]
        if id(param) not in owned or id(param) in done or not keys:
            continue
        done.add(id(param))  # a tied weight's state is loaded once, under the first name found
        for key in keys:
            md = stored[key]
            if not isinstance(md, TensorStorageMetadata):
                continue
            dtype = md.properties.dtype
            kept = _as_global(torch.zeros_like(param, dtype=dtype), param)
            # A padded vocabulary's state is stored unpadded: it loads into the real rows of ``kept``;
            # a packed parameter's in the single-process order.
            tensor, copied_from = kept, None
            if name in padded:
                tensor = _real_rows(padded[name], kept)
                copied_from = None if padded[name].has_view(kept) else padded[name]
            elif name in packed:
                tensor = natural_order_view(kept, *packed[name])
            if tuple(md.size) != tuple(tensor.shape):
                tensor = kept = torch.zeros(tuple(md.size), dtype=dtype)
                copied_from = None
            out[key] = _Destination(param, key[len(prefix) :], tensor, kept, copied_from)
    return out


def _hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each param group's plain settings (lr, betas, ...), JSON-ready."""
    return [
        {k: list(v) if isinstance(v, tuple) else v for k, v in group.items() if k != "params" and _plain(v)}
        for group in optimizer.param_groups
    ]


def _plain(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, bool | int | float | str)


# How the update runs, chosen for this layout's tensors (foreach lists cannot mix DTensors and plain
# tensors; fused and capturable follow the device): kept as the optimizer was built, not restored.
IMPLEMENTATION_OPTIONS = frozenset({"foreach", "fused", "capturable"})


def _restore_hyperparameters(optimizer: torch.optim.Optimizer, saved: list[dict[str, Any]]) -> None:
    if len(saved) != len(optimizer.param_groups):
        raise ValueError(
            f"the checkpoint's optimizer has {len(saved)} param groups, this one "
            f"{len(optimizer.param_groups)}"
        )
    for group, values in zip(optimizer.param_groups, saved):
        for key, value in values.items():
            if key not in IMPLEMENTATION_OPTIONS:
                group[key] = tuple(value) if isinstance(group.get(key), tuple) else value


def _rank_and_world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
