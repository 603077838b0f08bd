"""The ``train:`` section of a run config, a strictly checked dataclass (``data:``: data/config.py)."""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass

from brickwork.checks import check_choice
from brickwork.errors import ConfigError
from brickwork.extras import missing_package
from brickwork.train.precision import PRECISIONS
from brickwork.train.trackers import ALWAYS, TRACKERS

SCHEDULES = ("cosine", "linear", "constant")
OPTIMIZERS = ("adamw", "sgd")
DEVICES = ("auto", "cpu", "cuda")
FINITE = ("lr", "min_lr", "weight_decay", "momentum", "grad_clip", "sample_temperature")
POSITIVE = (
    "steps",
    "batch_size",
    "grad_accum_steps",
    "seq_len",
    "eval_interval",
    "eval_batches",
    "checkpoint_interval",
)
NON_NEGATIVE = ("warmup_steps", "sample_tokens", "keep_checkpoints", "seed", "max_skipped_steps")


@dataclass
class TrainConfig:
    """How to train: steps, batches, optimizer, learning-rate schedule, evaluation, checkpoints, output.

    The learning rate warms up linearly over ``warmup_steps`` and then follows ``schedule`` from
    ``lr`` down to ``min_lr`` at ``steps``; ``warmup_steps=None`` means 5% of the steps (config.yaml
    keeps the None, so that a later ``train.steps`` moves the warmup with it). ``grad_clip`` is the
    max global gradient norm (0 = off). The end-of-run sample continues ``sample_prompt`` (None: the
    first tokens of the held-out data) by ``sample_tokens`` tokens (None: ``seq_len``).
    ``batch_size`` rows make one optimizer step: split over the data-parallel ranks, then into
    ``grad_accum_steps`` micro-batches. ``precision`` is the train step's policy (fp32, bf16,
    bf16-mixed, fp16; see brickwork/train/precision.py). ``seq_len`` is the window of tokens for text
    tasks; image tasks take the model's image size. ``init_from`` is where a new run takes its
    starting weights (``brickwork train --init-from PATH``: anything ``from_pretrained`` reads).
    ``log_to`` names where the metrics go besides ``metrics.jsonl``, which is always written: one
    name or a list of them, from jsonl, tensorboard and wandb (brickwork/train/trackers/).
    ``compile`` compiles each layer, and the head and loss, as regions of their own
    (parallel/compile.py): ``auto`` is on where the run trains on CUDA and off on the CPU, where
    Inductor's C++ build costs more than a small model's steps gain. ``checkpoint_on_preempt``: a run
    stopped by SIGTERM or SIGUSR1 saves a checkpoint of the step it stops after
    (brickwork/train/preemption.py). ``max_skipped_steps``: an fp16 run whose steps overflow that many
    times in a row is diverging and stops with an error (0: never).
    """

    steps: int = 600
    batch_size: int = 16
    grad_accum_steps: int = 1
    seq_len: int = 128
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int | None = None
    schedule: str = "cosine"
    optimizer: str = "adamw"
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    momentum: float = 0.9
    grad_clip: float = 1.0
    seed: int = 0
    eval_interval: int = 50
    eval_batches: int = 4
    checkpoint_interval: int = 200
    keep_checkpoints: int = 2
    out_dir: str | None = None
    sample_prompt: str | None = None
    sample_tokens: int | None = None
    sample_temperature: float = 0.8
    device: str = "auto"
    precision: str = "fp32"
    init_from: str | None = None
    log_to: str | list[str] = "jsonl"
    compile: str | bool = "auto"
    checkpoint_on_preempt: bool = True
    max_skipped_steps: int = 10

    def __post_init__(self) -> None:
        if self.warmup_steps is None and isinstance(self.steps, int):
            self.warmup_steps = self.steps // 20
        if self.sample_tokens is None:
            self.sample_tokens = self.seq_len
        for name in FINITE:
            # 1e400 reads as inf, which every comparison below would let through.
            _check(math.isfinite(getattr(self, name)), name, "must be a finite number", getattr(self, name))
        for name in POSITIVE:
            _check(getattr(self, name) >= 1, name, "must be >= 1", getattr(self, name))
        for name in NON_NEGATIVE:
            _check(getattr(self, name) >= 0, name, "must be >= 0", getattr(self, name))
        # torch's generators take 64-bit seeds, and the data draws its validation set from seed + 1000003.
        _check(self.seed < 2**63, "seed", "must be below 2**63", self.seed)
        _check(
            self.warmup_steps < self.steps, "warmup_steps", f"must be < steps={self.steps}", self.warmup_steps
        )
        _check(self.lr > 0, "lr", "must be > 0", self.lr)
        _check(0 <= self.min_lr <= self.lr, "min_lr", f"must be in [0, lr={self.lr}]", self.min_lr)
        _check(self.weight_decay >= 0, "weight_decay", "must be >= 0", self.weight_decay)
        _check(self.grad_clip >= 0, "grad_clip", "must be >= 0 (0 turns clipping off)", self.grad_clip)
        _check(0 <= self.momentum < 1, "momentum", "must be in [0, 1)", self.momentum)
        _check(self.sample_temperature >= 0, "sample_temperature", "must be >= 0", self.sample_temperature)
        _check(all(0 <= b < 1 for b in self.betas), "betas", "must be two numbers in [0, 1)", self.betas)
        if self.sample_prompt is not None:
            _check(bool(self.sample_prompt), "sample_prompt", "must be non-empty or null", self.sample_prompt)
        check_choice(self.schedule, "schedule", SCHEDULES)
        check_choice(self.optimizer, "optimizer", OPTIMIZERS)
        check_choice(self.device, "device", DEVICES)
        check_choice(self.precision, "precision", PRECISIONS)
        # A membership test alone would take 1 and 0 for True and False.
        _check(isinstance(self.compile, bool) or self.compile == "auto", "compile",
               "must be auto, true or false", self.compile)  # fmt: skip
        self._check_trackers()

    def tracker_names(self) -> list[str]:
        """``log_to`` as a list of names."""
        return [self.log_to] if isinstance(self.log_to, str) else list(self.log_to)

    def _check_trackers(self) -> None:
        names = self.tracker_names()
        for name in names:
            check_choice(name, "log_to", (ALWAYS, *TRACKERS))
        _check(len(set(names)) == len(names), "log_to", "names a tracker twice", self.log_to)
        for name in names:
            package = TRACKERS[name].package if name != ALWAYS else None
            if package is not None and importlib.util.find_spec(package) is None:
                raise ConfigError(missing_package(package, f"log_to {name}"), "log_to")


def _check(ok: bool, name: str, message: str, got: object) -> None:
    if not ok:
        raise ConfigError(f"{message}, got {got!r}", name)
