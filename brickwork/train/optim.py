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
    # Plain tensors take an update that makes one call per step rather than one per tensor and op (on
    # a small model's CPU step the calls cost more than the arithmetic): SGD the list-wide (foreach)
    # one, the same values as torch's per-tensor loop; AdamW torch's fused kernel, the whole update of
    # a tensor in one pass, its values a few float32 ulps from the loop's. On the 4 x 128 model of
    # docs/benchmarks.md, one CPU thread: 0.5 ms per AdamW step, against 1.5 foreach and 1.7 for the
    # loop torch takes by default on CPU. DTensors (tensor parallel, FSDP) are left to torch.
    plain = all(type(p) in (torch.Tensor, torch.nn.Parameter) for p in params)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, foreach=True if plain else None)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), fused=True if plain else None)
