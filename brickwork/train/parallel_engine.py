"""Training under ``torchrun``: the model laid out by ``brickwork.parallel.parallelize`` from the dist dict.

Every rank runs the same loop on the same global batches (the parallel layer takes each rank's
share), so the loss curve is the one process's. Only rank 0 prints and writes the run folder; each
rank writes its own optimizer state into a checkpoint, and rank 0 the full weights.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from brickwork.errors import ConfigError
from brickwork.train.checkpoint import (
    WEIGHTS_FILE,
    checkpoint_dir,
    load_trainer_state,
    mark_complete,
    save_weights,
    start_checkpoint,
    trainer_state_path,
    weight_aliases,
)
from brickwork.train.local import lm_loss
from brickwork.train.run_config import RunConfig


def parallel_dist_dict(run: RunConfig) -> dict[str, Any]:
    """The dist dict with the train section's clipping and precision filled in.

    ``train.grad_clip`` and ``train.precision`` are the settings; a dist dict naming a different
    ``max_grad_norm`` or ``mixed_precision`` is refused rather than one of them being guessed at.
    """
    out = dict(run.dist)
    clip = run.train.grad_clip if run.train.grad_clip > 0 else None
    if out.get("max_grad_norm") not in (None, clip):
        raise ConfigError(
            f"{out['max_grad_norm']} disagrees with train.grad_clip={run.train.grad_clip}; set that one",
            "dist.max_grad_norm",
        )
    out["max_grad_norm"] = clip
    precision = run.train.precision
    mixed = out.get("mixed_precision", "fp32")
    if precision != "fp32" and mixed not in ("fp32", precision):
        raise ConfigError(f"{mixed!r} disagrees with train.precision={precision!r}", "dist.mixed_precision")
    out["mixed_precision"] = precision if precision != "fp32" else mixed
    return out


class ParallelEngine:
    """The loop's engine over a ParallelModel; every method is called on every rank."""

    def __init__(self, model: torch.nn.Module, run: RunConfig) -> None:
        from brickwork.parallel import parallelize

        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        self.spec = run.spec
        self.aliases = weight_aliases(model)
        self.pm = parallelize(model, parallel_dist_dict(run))
        self.rank = dist.get_rank()
        self.is_main = self.rank == 0
        # Every rank has checked the run folder before rank 0 writes into it.
        dist.barrier()

    def describe(self) -> str:
        c = self.pm.config
        return (
            f"{dist.get_world_size()} processes ({self.pm.mesh.device_type}): dp={c.data_parallel_size} "
            f"tp={c.tensor_parallel_size} pp={c.pipeline_parallel_size} zero_stage={c.zero_stage}"
        )

    def parameters(self) -> list[torch.nn.Parameter]:
        return list(self.pm.parameters())

    def train_step(
        self, input_ids: torch.Tensor, labels: torch.Tensor, optimizer: torch.optim.Optimizer
    ) -> float:
        self.pm.module.train()
        return self.pm.train_step(input_ids, labels, optimizer)

    @torch.no_grad()
    def evaluate(self, input_ids: torch.Tensor, labels: torch.Tensor, batch_size: int) -> float:
        """Mean token loss over [N, T] windows; every rank computes the same full logits."""
        self.pm.module.eval()
        total, count = 0.0, 0
        for start in range(0, input_ids.shape[0], batch_size):
            logits = self.pm(input_ids[start : start + batch_size])
            y = labels[start : start + batch_size].to(logits.device)
            total += lm_loss(logits, y).item() * y.numel()
            count += y.numel()
        return total / count

    def _local_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        # Under ZeRO-1 the state lives in this rank's part of the ZeroRedundancyOptimizer.
        stepped = self.pm.stepped_optimizer(optimizer)
        return getattr(stepped, "optim", stepped)

    def save(self, run_dir: Path, step: int, optimizer: torch.optim.Optimizer, extra: dict[str, Any]) -> None:
        """Rank 0 writes the full weights; each rank its optimizer shard; the marker comes last."""
        full = self.pm.full_state_dict()
        folder = checkpoint_dir(run_dir, step)
        if self.is_main:
            start_checkpoint(run_dir, step)
        dist.barrier()
        if self.is_main:
            save_weights(full, self.aliases, folder / WEIGHTS_FILE)
        optim_state = _to_local(self._local_optimizer(optimizer).state_dict())
        rng = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state()
        state = {"step": step, "optimizer": optim_state, "rng": rng, **extra}
        torch.save(state, trainer_state_path(folder, self.rank))
        dist.barrier()
        if self.is_main:
            mark_complete(folder, step)
        dist.barrier()

    def load(self, folder: Path, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Restore this rank's optimizer shard and RNG (the full weights were loaded before parallelize)."""
        state = load_trainer_state(folder, self.rank)
        local = self._local_optimizer(optimizer)
        local.load_state_dict(state["optimizer"])
        _restore_dtensor_state(local)
        torch.set_rng_state(state["rng"]["cpu"])
        if "cuda" in state["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state(state["rng"]["cuda"])
        return state

    def sample_model(self) -> torch.nn.Module | None:
        """On rank 0, a single-process copy of the trained model (gathering is collective)."""
        from brickwork.factory import build_model

        full = self.pm.full_state_dict()
        if not self.is_main:
            return None
        model = build_model(self.spec)
        model.load_state_dict(full, strict=True)
        return model

    def close(self) -> None:
        dist.barrier()
        dist.destroy_process_group()


def _to_local(value: Any) -> Any:
    """An optimizer state dict with each DTensor replaced by this rank's shard, a plain tensor."""
    if isinstance(value, DTensor):
        return value.to_local().detach().clone()
    if isinstance(value, dict):
        return {k: _to_local(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_local(v) for v in value)
    return value


def _restore_dtensor_state(optimizer: torch.optim.Optimizer) -> None:
    """Turn loaded shards back into DTensors laid out like their parameters."""
    for param, state in optimizer.state.items():
        if not isinstance(param, DTensor):
            continue
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and not isinstance(value, DTensor) and value.dim() > 0:
                state[key] = DTensor.from_local(
                    value,
                    param.device_mesh,
                    param.placements,
                    run_check=False,
                    shape=param.shape,
                    stride=param.stride(),
                )
