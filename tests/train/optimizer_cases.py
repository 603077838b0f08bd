"""A tiny decoder trained by brickwork's optimizers and schedule, and the function the spawned ranks of
the Muon layout test run (it must live in an importable module)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from train_cases import build, global_batches

from brickwork.parallel import full_state_dict, parallelize, split_rows
from brickwork.train import TrainStep
from brickwork.train.config import TrainConfig
from brickwork.train.optim import build_optimizer, learning_rate, set_learning_rate

MUON = TrainConfig(optimizer="muon", steps=3, warmup_steps=0, lr=1e-2, min_lr=1e-3, grad_clip=0.0)


def train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    cfg: TrainConfig,
    batches: list[dict[str, torch.Tensor]],
    first_step: int = 0,
) -> list[float]:
    """The loop ``brickwork train`` runs, without the files: the schedule's lr, then one step per
    batch; ``first_step`` is the index of the first batch's step. Returns the losses."""
    step = TrainStep(model, optimizer, "causal_lm")
    losses = []
    for index, batch in enumerate(batches, start=first_step):
        set_learning_rate(optimizer, learning_rate(index, cfg))
        losses.append(step(batch))
    return losses


def run_zero1() -> dict[str, Any]:
    """On each of 2 ranks: the decoder trained by Muon under ZeRO-1 (DDP, and each rank stepping its
    share of the parameters) on its rows of the global batches: the losses and the full weights."""
    rank = torch.distributed.get_rank()
    rows = split_rows(global_batches("decoder")[0]["input_ids"].shape[0], None, 2)
    start = sum(rows[:rank])
    mine = [{k: v[start : start + rows[rank]] for k, v in b.items()} for b in global_batches("decoder")]
    model = parallelize(build("decoder"), {"data_parallel_size": 2, "zero_stage": 1})
    losses = train(model, build_optimizer(model, MUON), MUON, mine)
    return {"losses": losses, "state": full_state_dict(model)}
