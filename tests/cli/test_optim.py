"""The learning-rate schedule and the optimizer's parameter groups."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from brickwork.errors import ConfigError
from brickwork.train.config import TrainConfig
from brickwork.train.optim import build_optimizer, learning_rate


def test_warmup_then_cosine_to_min_lr():
    cfg = TrainConfig(steps=110, warmup_steps=10, lr=1e-2, min_lr=1e-3)
    lrs = [learning_rate(s, cfg) for s in range(cfg.steps)]
    assert lrs[:10] == pytest.approx([1e-2 * (s + 1) / 10 for s in range(10)])
    for s in range(10, 110):
        # Cosine from lr at the first step after warmup to min_lr at the last step (index 109).
        progress = (s - 10) / 99
        expected = 1e-3 + 0.5 * (1e-2 - 1e-3) * (1 + math.cos(math.pi * progress))
        assert lrs[s] == pytest.approx(expected, rel=1e-12)
    assert lrs[10] == pytest.approx(1e-2) and lrs[-1] == pytest.approx(1e-3)
    assert all(a >= b for a, b in itertools.pairwise(lrs[10:]))


def test_linear_and_constant_schedules():
    linear = TrainConfig(steps=21, warmup_steps=0, lr=1.0, min_lr=0.0, schedule="linear")
    assert [learning_rate(s, linear) for s in (0, 10, 20)] == pytest.approx([1.0, 0.5, 0.0])
    constant = TrainConfig(steps=21, warmup_steps=4, lr=0.5, min_lr=0.0, schedule="constant")
    assert [learning_rate(s, constant) for s in (0, 3, 4, 20)] == pytest.approx([0.125, 0.5, 0.5, 0.5])


def test_weight_decay_only_on_matrices():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.LayerNorm(4))
    opt = build_optimizer(model.parameters(), TrainConfig(weight_decay=0.25, betas=(0.8, 0.9)))
    assert isinstance(opt, torch.optim.AdamW)
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.25 and plain["weight_decay"] == 0.0
    assert {p.shape for p in decayed["params"]} == {torch.Size([10, 4]), torch.Size([4, 4])}
    assert len(plain["params"]) == 3
    assert decayed["betas"] == (0.8, 0.9)
    assert decayed["fused"] and plain["fused"]  # plain tensors: torch's fused AdamW
    sgd = build_optimizer(model.parameters(), TrainConfig(optimizer="sgd", momentum=0.5))
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["momentum"] == 0.5
    assert sgd.param_groups[0]["foreach"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"steps": 0}, "steps: must be a positive integer, got 0"),
        ({"warmup_steps": 5, "steps": 5}, "warmup_steps: must be < steps=5"),
        ({"min_lr": 0.1, "lr": 0.01}, r"min_lr: must be in \[0, lr=0.01\]"),
        ({"schedule": "cosin"}, "schedule: unknown value 'cosin'.*did you mean 'cosine'"),
        ({"optimizer": "adam"}, "optimizer: .*allowed: adamw, muon, sgd"),
        ({"betas": (0.9, 1.0)}, r"betas: must be two numbers in \[0, 1\)"),
        ({"sample_prompt": ""}, "sample_prompt: must be non-empty"),
    ],
)
def test_bad_train_options_name_the_key(options, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**options)
