"""``train.schedule: wsd``: the curve against a float64 formula written here, its options' checks, and
what config.yaml and a resume make of them (the exact resume is tests/train/test_muon.py's, under wsd)."""

from __future__ import annotations

import math

import pytest

from brickwork.errors import ConfigError
from brickwork.train.config import TrainConfig
from brickwork.train.optim import learning_rate
from brickwork.train.resume_overrides import check_resume_overrides
from brickwork.train.run_config import resolve_run

STEPS, WARMUP, DECAY, LR, MIN_LR = 50, 5, 15, 1e-2, 1e-4


def reference(step: int, shape: str) -> float:
    """Warmup to LR, LR until the last DECAY steps, then down to MIN_LR on the last one."""
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    if step < STEPS - DECAY:
        return LR
    done = (step - (STEPS - DECAY) + 1) / DECAY  # 1/DECAY on the first decay step, 1 on the last
    left = {"linear": 1 - done, "cosine": (1 + math.cos(math.pi * done)) / 2, "sqrt": 1 - math.sqrt(done)}
    return MIN_LR + (LR - MIN_LR) * left[shape]


@pytest.mark.parametrize("shape", ["linear", "cosine", "sqrt"])
def test_curve_is_warmup_stable_then_the_decay_shape(shape):
    cfg = TrainConfig(
        schedule="wsd",
        steps=STEPS,
        warmup_steps=WARMUP,
        lr=LR,
        min_lr=MIN_LR,
        decay_fraction=0.3,
        decay_shape=shape,
    )
    got = [learning_rate(s, cfg) for s in range(STEPS)]
    assert got == pytest.approx([reference(s, shape) for s in range(STEPS)], rel=1e-12, abs=0)
    assert got[WARMUP : STEPS - DECAY] == [LR] * (STEPS - DECAY - WARMUP)
    assert got[-1] == MIN_LR and all(a > b for a, b in zip(got[-DECAY - 1 :], got[-DECAY:]))


def test_defaults_decay_the_last_fifth_linearly():
    cfg = TrainConfig(schedule="wsd", steps=10, warmup_steps=0, lr=1.0, min_lr=0.0)
    assert cfg.decay_fraction is None and cfg.option("decay_fraction") == 0.2
    assert [learning_rate(s, cfg) for s in range(10)] == pytest.approx([1.0] * 8 + [0.5, 0.0])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"decay_fraction": 0.3}, "decay_fraction: applies to schedule wsd only, and schedule is 'cosine'"),
        ({"schedule": "linear", "decay_shape": "sqrt"}, "decay_shape: applies to schedule wsd only"),
        ({"schedule": "wsd", "decay_fraction": 0}, r"decay_fraction: must be a number in \(0, 1\], got 0"),
        ({"schedule": "wsd", "decay_fraction": 1.5}, r"decay_fraction: must be a number in \(0, 1\]"),
        (
            {"schedule": "wsd", "decay_shape": "exp"},
            "decay_shape: unknown value 'exp'; allowed: cosine, linear, sqrt",
        ),
        (
            {"schedule": "wsd", "steps": 10, "warmup_steps": 3, "decay_fraction": 0.8},
            "decay_fraction: decays over the last 8 of steps=10, which overlaps the warmup_steps=3",
        ),
    ],
)
def test_bad_wsd_options_name_the_key(options, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**options)


def test_config_yaml_keeps_only_what_was_chosen_and_a_resume_may_change_the_decay():
    run = resolve_run(None, ["train.schedule=wsd", "train.decay_shape=sqrt"])
    train = run.to_dict()["train"]
    assert (train["schedule"], train["decay_shape"], train["decay_fraction"]) == ("wsd", "sqrt", None)
    check_resume_overrides(["train.decay_fraction=0.1", "train.decay_shape=cosine"])
