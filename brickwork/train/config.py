"""The ``train:`` section of a run config, a strictly checked dataclass (``data:``: data/config.py)."""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass

from brickwork.checks import (
    check_bool,
    check_choice,
    check_positive_float,
    check_positive_int,
    check_probability,
)
from brickwork.errors import ConfigError
from brickwork.extras import missing_package
from brickwork.train.fp8 import FP8_RECIPES, check_torchao
from brickwork.train.precision import PRECISIONS
from brickwork.train.trackers import ALWAYS, TRACKERS

SCHEDULES = ("cosine", "linear", "constant", "wsd")
DECAY_SHAPES = ("linear", "cosine", "sqrt")
OPTIMIZERS = ("adamw", "sgd", "muon")
MUON_ADJUST_LR = ("match_rms_adamw", "original")
# Options of one schedule or optimizer only: (the option it belongs to, its value, the default there).
# They stay None unless set, so config.yaml records only what the user chose; set beside another
# choice they are refused, and under theirs None means the default.
ONLY_WITH = {
    "decay_fraction": ("schedule", "wsd", 0.2),
    "decay_shape": ("schedule", "wsd", "linear"),
    "muon_momentum": ("optimizer", "muon", 0.95),
    "muon_nesterov": ("optimizer", "muon", True),
    "muon_ns_steps": ("optimizer", "muon", 5),
    "muon_adjust_lr": ("optimizer", "muon", "match_rms_adamw"),
}
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
    keeps the None, so that a later ``train.steps`` moves the warmup with it). ``wsd`` holds ``lr``
    and decays over the last ``decay_fraction`` of the steps, shaped by ``decay_shape``
    (brickwork/train/optim.py). ``muon`` steps the blocks' matrices with torch's Muon and the rest
    with AdamW, with ``muon_momentum``, ``muon_nesterov``, ``muon_ns_steps`` and ``muon_adjust_lr``
    (brickwork/train/muon.py). :data:`ONLY_WITH` gives their defaults; ``option(name)`` reads one.
    ``grad_clip`` is the max global gradient norm (0 = off). The end-of-run sample continues
    ``sample_prompt`` (None: the first tokens of the held-out data) by ``sample_tokens`` tokens (None:
    ``seq_len``).
    ``batch_size`` rows make one optimizer step: split over the data-parallel ranks, then into
    ``grad_accum_steps`` micro-batches. ``precision`` is the train step's policy (fp32, bf16,
    bf16-mixed, fp16, fp8; see brickwork/train/precision.py); under fp8, ``fp8_recipe`` (None:
    tensorwise) and ``fp8_min_features`` (None: torchao's size rule for the recipe) choose the float8
    scaling and which linears convert (brickwork/train/fp8.py). ``seq_len`` is the window of tokens for text
    tasks; image tasks take the model's image size. ``init_from`` is where a new run takes its
    starting weights (``brickwork train --init-from PATH``: anything ``from_pretrained`` reads).
    ``log_to`` names where the metrics go besides ``metrics.jsonl``, which is always written: one
    name or a list of them, from jsonl, tensorboard and wandb (brickwork/train/trackers/).
    ``compile`` compiles each layer, and the head and loss, as regions of their own
    (parallel/compile.py): ``auto`` is on where the run trains on CUDA and off on the CPU, where
    Inductor's C++ build costs more than a small model's steps gain. ``checkpoint_on_preempt``: a run
    stopped by SIGTERM or SIGUSR1 saves a checkpoint of the step it stops after
    (brickwork/train/preemption.py). ``async_checkpoint`` writes each checkpoint in the background while
    training goes on (brickwork/train/checkpoint_writer.py). ``max_skipped_steps``: an fp16 run whose
    steps overflow that many times in a row is diverging and stops with an error (0: never).
    """

    steps: int = 600
    batch_size: int = 16
    grad_accum_steps: int = 1
    seq_len: int = 128
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int | None = None
    schedule: str = "cosine"
    decay_fraction: float | None = None
    decay_shape: str | None = None
    optimizer: str = "adamw"
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    momentum: float = 0.9
    muon_momentum: float | None = None
    muon_nesterov: bool | None = None
    muon_ns_steps: int | None = None
    muon_adjust_lr: str | None = None
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
    fp8_recipe: str | None = None
    fp8_min_features: int | None = None
    init_from: str | None = None
    log_to: str | list[str] = "jsonl"
    compile: str | bool = "auto"
    checkpoint_on_preempt: bool = True
    async_checkpoint: bool = False
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
        self._check_only_with()
        self._check_fp8()
        # A membership test alone would take 1 and 0 for True and False.
        _check(isinstance(self.compile, bool) or self.compile == "auto", "compile",
               "must be auto, true or false", self.compile)  # fmt: skip
        _check(isinstance(self.async_checkpoint, bool), "async_checkpoint", "must be true or false",
               self.async_checkpoint)  # fmt: skip
        self._check_trackers()

    def tracker_names(self) -> list[str]:
        """``log_to`` as a list of names."""
        return [self.log_to] if isinstance(self.log_to, str) else list(self.log_to)

    def _check_fp8(self) -> None:
        for name in ("fp8_recipe", "fp8_min_features"):
            value = getattr(self, name)
            _check(value is None or self.precision == "fp8", name,
                   f"applies to precision fp8 only, and precision is {self.precision!r}", value)  # fmt: skip
        if self.precision != "fp8":
            return
        if self.fp8_recipe is not None:
            check_choice(self.fp8_recipe, "fp8_recipe", FP8_RECIPES)
        if self.fp8_min_features is not None:
            check_positive_int(self.fp8_min_features, "fp8_min_features")
        check_torchao("precision")

    def option(self, name: str) -> object:
        """An option of :data:`ONLY_WITH`, its default where the user left it unset."""
        value = getattr(self, name)
        return ONLY_WITH[name][2] if value is None else value

    def _check_only_with(self) -> None:
        for name, (owner, choice, _) in ONLY_WITH.items():
            _check(getattr(self, name) is None or getattr(self, owner) == choice, name,
                   f"applies to {owner} {choice} only, and {owner} is {getattr(self, owner)!r}",
                   getattr(self, name))  # fmt: skip
        if self.schedule == "wsd":
            fraction = self.option("decay_fraction")
            check_positive_float(fraction, "decay_fraction")
            _check(fraction <= 1, "decay_fraction", "must be in (0, 1]", fraction)
            check_choice(self.option("decay_shape"), "decay_shape", DECAY_SHAPES)
            decay = self.decay_steps()
            _check(self.warmup_steps + decay <= self.steps, "decay_fraction",
                   f"decays over the last {decay} of steps={self.steps}, which overlaps the "
                   f"warmup_steps={self.warmup_steps}; lower one of them", fraction)  # fmt: skip
        if self.optimizer == "muon":
            check_probability(self.option("muon_momentum"), "muon_momentum")
            check_bool(self.option("muon_nesterov"), "muon_nesterov")
            steps = self.option("muon_ns_steps")
            # torch's Newton-Schulz refuses 100 steps or more.
            check_positive_int(steps, "muon_ns_steps")
            _check(steps < 100, "muon_ns_steps", "must be below 100", steps)
            check_choice(self.option("muon_adjust_lr"), "muon_adjust_lr", MUON_ADJUST_LR)

    def decay_steps(self) -> int:
        """How many of the last steps ``wsd`` decays over: ``decay_fraction`` of them, rounded, at least 1."""
        return max(1, round(self.option("decay_fraction") * self.steps))

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
