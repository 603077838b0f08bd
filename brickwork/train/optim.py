"""The optimizer and the learning-rate schedule (linear warmup, then cosine, linear, constant or
warmup-stable-decay)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from brickwork.train.config import TrainConfig
from brickwork.train.muon import build_muon


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """The learning rate for optimizer step ``step`` (0-based) of ``cfg.steps``.

    A pure function of the step, so a resumed run needs no scheduler state to continue the curve.
    """
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return cfg.lr
    if cfg.schedule == "wsd":
        return _warmup_stable_decay(step, cfg)
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - 1 - cfg.warmup_steps))
    if cfg.schedule == "linear":
        return cfg.lr + (cfg.min_lr - cfg.lr) * progress
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * progress))


def _warmup_stable_decay(step: int, cfg: TrainConfig) -> float:
    """WSD after its warmup: ``lr`` until the last ``D = cfg.decay_steps()`` steps, then down to
    ``min_lr`` at the last step, along ``decay_shape`` of the progress ``p = (step - (steps - D) + 1) / D``
    (1/D on the first decay step, 1 on the last):

    - ``linear``: ``min_lr + (lr - min_lr) * (1 - p)``
    - ``cosine``: ``min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2``
    - ``sqrt``: ``min_lr + (lr - min_lr) * (1 - sqrt(p))``, the "1-sqrt" cooldown of Hägele et al.,
      "Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations" (2024), which
      matched a cosine schedule's loss there

    These are torchtitan's WSD shapes, with the decay ending exactly at ``min_lr`` on the last step,
    as this module's other schedules do.
    """
    decay = cfg.decay_steps()
    progress = min(1.0, (step - (cfg.steps - decay) + 1) / decay)
    if progress <= 0:
        return cfg.lr
    shape = cfg.option("decay_shape")
    if shape == "linear":
        left = 1.0 - progress
    elif shape == "cosine":
        left = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        left = 1.0 - math.sqrt(progress)
    return cfg.min_lr + (cfg.lr - cfg.min_lr) * left


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def build_optimizer(model: nn.Module | Iterable[nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW, SGD or Muon (with AdamW) over ``model``'s trainable parameters, with weight decay on
    matrices and embeddings only. ``model`` is a module (a plain or a parallelized one), or, for
    adamw and sgd, its parameters; muon needs the module to find the blocks' matrices
    (brickwork/train/muon.py).

    Biases and norm gains (1-d tensors) are not decayed: shrinking them towards zero only hurts.
    """
    if cfg.optimizer == "muon" and not isinstance(model, nn.Module):
        raise TypeError("optimizer muon needs the model, not its parameters: build_optimizer(model, cfg)")
    parameters = model.parameters() if isinstance(model, nn.Module) else model
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
    if cfg.optimizer == "muon":
        # One learning rate for both parts, the schedule's: match_rms_adamw scales Muon's update to
        # the RMS of AdamW's, so AdamW's lr and weight decay carry over (Liu et al., "Muon is Scalable
        # for LLM Training", 2025).
        options = {
            "lr": cfg.lr,
            "betas": tuple(cfg.betas),
            "fused": True if plain else None,
            "momentum": cfg.option("muon_momentum"),
            "nesterov": cfg.option("muon_nesterov"),
            "ns_steps": cfg.option("muon_ns_steps"),
            "adjust_lr_fn": cfg.option("muon_adjust_lr"),
        }
        return build_muon(model, options, groups)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), fused=True if plain else None)
