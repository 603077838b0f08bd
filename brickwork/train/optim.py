"""The optimizer and the learning-rate schedule (linear warmup, then cosine, linear or constant)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from brickwork.train.config import TrainConfig


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """The learning rate for optimizer step ``step`` (0-based) of ``cfg.steps``.

    A pure function of the step, so a resumed run needs no scheduler state to continue the curve.
    """
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return cfg.lr
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - 1 - cfg.warmup_steps))
    if cfg.schedule == "linear":
        return cfg.lr + (cfg.min_lr - cfg.lr) * progress
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * progress))


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def build_optimizer(parameters: Iterable[torch.nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW or SGD over ``parameters``, with weight decay on matrices and embeddings only.

    Biases and norm gains (1-d tensors) are not decayed: shrinking them towards zero only hurts.
    """
    params = [p for p in parameters if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    # torch takes the list-wide (foreach) update by default on GPUs only; it computes the same values as
    # the per-tensor loop, with one call per step instead of one per tensor, which on a small model's
    # CPU step costs more than the arithmetic. Left to torch for DTensors (tensor parallel, FSDP).
    foreach = True if all(type(p) in (torch.Tensor, torch.nn.Parameter) for p in params) else None
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, foreach=foreach)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), foreach=foreach)
