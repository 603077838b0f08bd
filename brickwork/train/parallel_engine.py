"""Training under ``torchrun``: the model laid out by ``brickwork.parallel.parallelize`` from the dist dict.

Every rank runs the same loop on the same global batches (the parallel layer takes each rank's
share), so the loss curve is the one process's. Only rank 0 prints and writes the run folder; each
rank writes its own shards of a checkpoint (``brickwork.parallel.save_checkpoint``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from brickwork.errors import ConfigError
from brickwork.parallel import ParallelModel, parallelize
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
        self.spec = run.spec
        self.pm = parallelize(model, parallel_dist_dict(run))
        self.rank = dist.get_rank()
        self.is_main = self.rank == 0
        # Every rank has checked the run folder before rank 0 writes into it.
        dist.barrier()

    @property
    def checkpoint_model(self) -> ParallelModel:
        """What a checkpoint saves and loads: the ParallelModel, whose shards each rank writes."""
        return self.pm

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
