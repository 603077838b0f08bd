"""``parallelize(model, dist)`` and the ParallelModel it returns (the contract of DESIGN.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel
from torch.nn.parallel import DistributedDataParallel

from brickwork.errors import ConfigError
from brickwork.parallel.activation_checkpointing import apply_activation_checkpointing
from brickwork.parallel.agreement import check_agreement
from brickwork.parallel.balance import split_rows
from brickwork.parallel.config import ParallelConfig
from brickwork.parallel.data_parallel import DTYPES, LocalShards, ZeroOptimizers, apply_ddp, apply_fsdp
from brickwork.parallel.grad_norm import clip_grad_norm, settle_gradients
from brickwork.parallel.materialize import materialize, take_source, uses_meta_init
from brickwork.parallel.mesh import build_mesh, mesh_device_type
from brickwork.parallel.styles import PACKED_ATTR, unpack_full
from brickwork.parallel.tensor_parallel import (
    apply_tensor_parallel,
    check_tensor_parallel,
    component_plan,
    merge_plans,
    name_plan,
)

IGNORE_INDEX = -100


def parallelize(
    model: nn.Module,
    dist_config: Mapping[str, Any] | ParallelConfig,
    *,
    plan: Mapping[str, str] | None = None,
    divide: Mapping[str, Sequence[str]] | None = None,
) -> ParallelModel:
    """Lay ``model`` out over all ranks as the dist dict says; every rank calls it with the same model.

    Tensor parallel follows the components' own ``tp_plan()`` declarations, plus ``plan`` (glob
    pattern -> style), whose entries are added and win over a component's entry for the same
    module: that is how a model brickwork did not build is sharded (``divide`` names attributes such
    as head counts to divide by the TP size). Every check runs before the first collective, so a bad dist
    dict raises the same ConfigError on every rank. Rank 0 may pass the real model while the other
    ranks pass it built on the meta device (see parallel/materialize.py), except under a pipeline.

    With ``pipeline_parallel_size`` > 1 the result is a PipelineParallelModel (parallel/pipeline_model.py)
    whose ranks each hold their pipeline stages; the contract is the same.
    """
    if not dist.is_initialized():
        build_mesh(dist_config)
    check_agreement(model, dist_config)
    config = ParallelConfig.from_dict(dist_config, world_size=dist.get_world_size())
    entries = merge_plans(component_plan(model), name_plan(model, plan) if plan else [])
    tp = config.tensor_parallel_size
    if tp > 1:
        if not entries:
            raise ConfigError(
                f"tensor_parallel_size={tp} but {type(model).__name__} declares no tensor-parallel plan",
                "tensor_parallel_size",
            )
        check_tensor_parallel(model, entries, tp)
    if config.pipeline_parallel_size > 1:
        # Imported here: the pipeline model builds on this module's ParallelModel.
        from brickwork.parallel.pipeline_model import parallelize_pipeline

        pipelined = parallelize_pipeline(model, config, plan, divide)
        pipelined.spec = getattr(model, "spec", None)
        return pipelined
    mesh = build_mesh(config)
    device = torch.device(
        mesh.device_type, torch.cuda.current_device() if mesh.device_type == "cuda" else None
    )
    meta = uses_meta_init(model, device)
    source = take_source(model, device) if meta else {}
    if not meta:
        model.to(device)
    if tp > 1:
        apply_tensor_parallel(
            model, entries, mesh["tp"], sequence_parallel=config.sequence_parallel, divide=divide
        )
    apply_activation_checkpointing(model, config.activation_checkpointing)
    root: nn.Module = model
    if config.zero_stage >= 2:
        apply_fsdp(model, config, mesh["dp"])
        if meta:
            materialize(model, source, device)
    else:
        if meta:
            materialize(model, source, device)
        if config.data_parallel_size > 1:
            root = apply_ddp(model, mesh["dp"])
    parallel_model = ParallelModel(model, root, config, mesh)
    parallel_model.spec = getattr(model, "spec", None)
    return parallel_model


class ParallelModel:
    """A model laid out over a (pp, dp, tp) mesh, with a train step that equals one process's.

    ``module`` is the parallelized model itself (its parameter names are the single-process ones);
    calling the ParallelModel runs the forward on the full batch and returns full logits.
    """

    def __init__(self, module: nn.Module, root: nn.Module, config: ParallelConfig, mesh: DeviceMesh) -> None:
        self.module = module
        self.root = root
        self.config = config
        self.mesh = mesh
        # Under DDP + TP the trainable tensors are the local shards DDP holds (data_parallel.LocalShards).
        self._params = list(root.parameters())
        self._zero = ZeroOptimizers(mesh["dp"]) if config.zero_stage == 1 else None
        self.spec: dict[str, Any] | None = None  # the model's resolved spec, kept for checkpoints

    def parameters(self) -> Iterator[nn.Parameter]:
        """This rank's parameters (shards under TP/FSDP). Build the optimizer from them."""
        return iter(self._params)

    def named_trainable(self) -> dict[str, torch.Tensor]:
        """Each of the model's parameter names (tied names too) -> the tensor the optimizer holds for it:
        the parameter itself, or under DDP + TP its local shard (data_parallel.LocalShards)."""
        inner = self.root.module if isinstance(self.root, DistributedDataParallel) else self.root
        if isinstance(inner, LocalShards):
            return dict(inner.by_name)
        return dict(self.module.named_parameters(remove_duplicate=False))

    def stepped_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The optimizer ``train_step`` really steps for ``optimizer``: under ZeRO-1 its
        ZeroRedundancyOptimizer (each rank holding 1/dp of the state), otherwise ``optimizer``."""
        return self._zero.get(optimizer) if self._zero is not None else optimizer

    def __call__(self, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """Forward on the whole batch [B, T] -> full logits [B, T, vocab] (gathered over TP)."""
        with self._autocast():
            logits = _logits(self.root(input_ids.to(self.mesh.device_type), **kwargs))
        return logits.full_tensor() if isinstance(logits, DTensor) else logits

    def train_step(
        self, input_ids: torch.Tensor, labels: torch.Tensor, optimizer: torch.optim.Optimizer
    ) -> float:
        """One optimizer step on the global batch; returns its mean token cross-entropy on every rank.

        input_ids, labels: [B, T] (labels already aligned; -100 is ignored). Each data-parallel rank
        trains on its contiguous B/dp rows (or rows in proportion to ``device_weights``); the loss
        is scaled by dp / (tokens of the global batch), so the dp-averaged gradients are those of the
        mean over every token of the global batch, however the rows are split.
        """
        dp = self.config.data_parallel_size
        local_ids, local_labels, tokens = self._local_batch(input_ids, labels)
        optimizer = self.stepped_optimizer(optimizer)
        optimizer.zero_grad(set_to_none=True)
        with self._autocast():
            logits = _logits(self.root(local_ids))
        parallel_loss = isinstance(logits, DTensor)
        with loss_parallel() if parallel_loss else contextlib.nullcontext():
            loss_sum = F.cross_entropy(
                logits.flatten(0, 1).float(),
                local_labels.flatten(),
                reduction="sum",
                ignore_index=IGNORE_INDEX,
            )
            # DDP and FSDP average gradients over dp, so each rank's share is scaled up by dp.
            (loss_sum * (dp / tokens)).backward()
        settle_gradients(self._params)
        if self.config.max_grad_norm is not None:
            clip_grad_norm(self._params, self.config.max_grad_norm)
        optimizer.step()
        total = (loss_sum.to_local() if parallel_loss else loss_sum).detach().double().reshape(1)
        dist.all_reduce(total, group=self.mesh["dp"].get_group())
        return float(total) / tokens

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The full weights on every rank (CPU), keyed like the single-process model's state_dict."""
        return gather_full_state(self.module)

    def _local_batch(
        self, input_ids: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """This data-parallel rank's rows of the global batch (on the mesh's device), and the number
        of tokens to learn from in the whole global batch. ValueError, naming the numbers, for a
        batch that does not split (every rank sees the same batch, so every rank raises)."""
        if input_ids.dim() != 2 or labels.shape != input_ids.shape:
            raise ValueError(
                f"input_ids and labels must both be [B, T], got {tuple(input_ids.shape)} and "
                f"{tuple(labels.shape)}"
            )
        batch, seq = input_ids.shape
        dp, tp = self.config.data_parallel_size, self.config.tensor_parallel_size
        if self.config.sequence_parallel and seq % tp:
            raise ValueError(
                f"sequence length {seq} is not divisible by tensor_parallel_size={tp} (sequence_parallel on)"
            )
        # device_weights with pipeline_parallel_size 1 are per data-parallel rank: uneven rows.
        weights = self.config.device_weights if self.config.pipeline_parallel_size == 1 else None
        rows = split_rows(batch, weights, dp)
        rank = self.mesh["dp"].get_local_rank()
        start = sum(rows[:rank])
        tokens = int((labels != IGNORE_INDEX).sum())
        if tokens == 0:
            raise ValueError("labels hold no token to learn from (all are -100)")
        device = self.mesh.device_type
        local = slice(start, start + rows[rank])
        return input_ids[local].to(device), labels[local].to(device), tokens

    def _autocast(self) -> contextlib.AbstractContextManager:
        # FSDP casts parameters itself (MixedPrecisionPolicy); DDP and plain TP compute under autocast.
        if self.config.mixed_precision == "fp32" or self.config.zero_stage >= 2:
            return contextlib.nullcontext()
        return torch.autocast(self.mesh.device_type, dtype=DTYPES[self.config.mixed_precision])


def gather_full_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """``module``'s state dict as full CPU tensors (DTensors gathered, packed columns put back).

    Collective over the meshes of its DTensors: every rank holding a part of ``module`` calls it.
    """
    packed = {}
    for prefix, sub in module.named_modules():
        for pname, layout in getattr(sub, PACKED_ATTR, {}).items():
            packed[f"{prefix}.{pname}" if prefix else pname] = layout
    out = {}
    for name, value in module.state_dict().items():
        if isinstance(value, DTensor):
            value = value.full_tensor()
        if name in packed:
            value = unpack_full(value, packed[name][0], packed[name][1].to(value.device))
        out[name] = value.detach().cpu().clone()
    return out


def _logits(output: Any) -> torch.Tensor:
    """The logits of a model's output: a tensor, or an object/dict with ``logits`` (HF models)."""
    if isinstance(output, torch.Tensor):
        return output
    logits = output.get("logits") if isinstance(output, Mapping) else getattr(output, "logits", None)
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"the model returned {type(output).__name__}, not logits or an object with .logits")
    return logits


__all__ = ["ParallelModel", "mesh_device_type", "parallelize"]
