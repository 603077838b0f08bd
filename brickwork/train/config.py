"""The ``train:`` section of a run config, a strictly checked dataclass (``data:``: data/config.py)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Annotated

from brickwork.checks import (
    Flag,
    InRange,
    NonNegative,
    NonNegativeInt,
    OneOf,
    PositiveFloat,
    PositiveInt,
    Probability,
    check_non_empty,
    check_positive_int,
)
from brickwork.errors import ConfigError
from brickwork.extras import missing_package
from brickwork.option_types import CheckedConfig
from brickwork.train.fp8 import FP8_RECIPES, check_torchao
from brickwork.train.precision import PRECISIONS
from brickwork.train.trackers import ALWAYS, TRACKERS

SCHEDULES = ("cosine", "linear", "constant", "wsd")
DECAY_SHAPES = ("linear", "cosine", "sqrt")
OPTIMIZERS = ("adamw", "sgd", "muon")
MUON_ADJUST_LR = ("match_rms_adamw", "original")
# Options of one schedule, optimizer or precision only: (the option it belongs to, its value, the
# default there). They stay None unless set, so config.yaml records only what the user chose; set
# beside another choice they are refused, and under theirs None means the default.
ONLY_WITH = {
    "decay_fraction": ("schedule", "wsd", 0.2),
    "decay_shape": ("schedule", "wsd", "linear"),
    "muon_momentum": ("optimizer", "muon", 0.95),
    "muon_nesterov": ("optimizer", "muon", True),
    "muon_ns_steps": ("optimizer", "muon", 5),
    "muon_adjust_lr": ("optimizer", "muon", "match_rms_adamw"),
    "fp8_recipe": ("precision", "fp8", "tensorwise"),
    "fp8_min_features": ("precision", "fp8", None),  # None: torchao's size rule for the recipe
}
DEVICES = ("auto", "cpu", "cuda")


def _check_seed(value: object, option: str) -> None:
    # torch's generators take 64-bit seeds, and the data draws its validation set from seed + 1000003.
    if isinstance(value, int) and value >= 2**63:
        raise ConfigError(f"must be below 2**63, got {value!r}", option)


def _check_betas(value: object, option: str) -> None:
    numbers = isinstance(value, list | tuple) and all(isinstance(b, int | float) for b in value)
    if not numbers or len(value) != 2 or not all(0 <= b < 1 for b in value):
        raise ConfigError(f"must be two numbers in [0, 1), got {value!r}", option)


def _check_compile(value: object, option: str) -> None:
    # A membership test alone would take 1 and 0 for True and False.
    if not (isinstance(value, bool) or value == "auto"):
        raise ConfigError(f"must be auto, true or false, got {value!r}", option)


def _check_trackers(value: object, option: str) -> None:
    names = list(value) if isinstance(value, list | tuple) else [value]
    for name in names:
        OneOf((ALWAYS, *TRACKERS))(name, option)
    if len(set(names)) != len(names):
        raise ConfigError(f"names a tracker twice, got {value!r}", option)
    for name in names:
        package = TRACKERS[name].package if name != ALWAYS else None
        if package is not None and importlib.util.find_spec(package) is None:
            raise ConfigError(missing_package(package, f"log_to {name}"), option)


@dataclass(frozen=True)
class TrainConfig(CheckedConfig):
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

    steps: PositiveInt = 600
    batch_size: PositiveInt = 16
    grad_accum_steps: PositiveInt = 1
    seq_len: PositiveInt = 128
    lr: PositiveFloat = 3e-3
    min_lr: NonNegative = 3e-4
    warmup_steps: NonNegativeInt | None = None
    schedule: Annotated[str, OneOf(SCHEDULES)] = "cosine"
    decay_fraction: Annotated[float, InRange(0, 1, open_low=True)] | None = None
    decay_shape: Annotated[str, OneOf(DECAY_SHAPES)] | None = None
    optimizer: Annotated[str, OneOf(OPTIMIZERS)] = "adamw"
    weight_decay: NonNegative = 0.1
    betas: Annotated[tuple[float, float], _check_betas] = (0.9, 0.95)
    momentum: Probability = 0.9
    muon_momentum: Probability | None = None
    muon_nesterov: Flag | None = None
    # torch's Newton-Schulz refuses 100 steps or more.
    muon_ns_steps: Annotated[int, check_positive_int, InRange(1, 100, open_high=True)] | None = None
    muon_adjust_lr: Annotated[str, OneOf(MUON_ADJUST_LR)] | None = None
    grad_clip: NonNegative = 1.0
    seed: Annotated[int, InRange(0), _check_seed] = 0
    eval_interval: PositiveInt = 50
    eval_batches: PositiveInt = 4
    checkpoint_interval: PositiveInt = 200
    keep_checkpoints: NonNegativeInt = 2
    out_dir: str | None = None
    sample_prompt: Annotated[str, check_non_empty] | None = None
    sample_tokens: NonNegativeInt | None = None
    sample_temperature: NonNegative = 0.8
    device: Annotated[str, OneOf(DEVICES)] = "auto"
    precision: Annotated[str, OneOf(PRECISIONS)] = "fp32"
    fp8_recipe: Annotated[str, OneOf(FP8_RECIPES)] | None = None
    fp8_min_features: PositiveInt | None = None
    init_from: str | None = None
    log_to: Annotated[str | list[str], _check_trackers] = "jsonl"
    compile: Annotated[str | bool, _check_compile] = "auto"
    checkpoint_on_preempt: Flag = True
    async_checkpoint: Flag = False
    max_skipped_steps: NonNegativeInt = 10

    def check_options(self) -> None:
        """The derived defaults (the rules after them read them), then the rules spanning options."""
        # Filled while the config is built, the one time a frozen one may be (config.yaml keeps None).
        if self.warmup_steps is None:
            object.__setattr__(self, "warmup_steps", self.steps // 20)
        if self.sample_tokens is None:
            object.__setattr__(self, "sample_tokens", self.seq_len)
        _check(
            self.warmup_steps < self.steps, "warmup_steps", f"must be < steps={self.steps}", self.warmup_steps
        )
        _check(0 <= self.min_lr <= self.lr, "min_lr", f"must be in [0, lr={self.lr}]", self.min_lr)
        self._check_only_with()
        if self.precision == "fp8":
            check_torchao("precision")

    def tracker_names(self) -> list[str]:
        """``log_to`` as a list of names."""
        return [self.log_to] if isinstance(self.log_to, str) else list(self.log_to)

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
            decay, fraction = self.decay_steps(), self.option("decay_fraction")
            _check(self.warmup_steps + decay <= self.steps, "decay_fraction",
                   f"decays over the last {decay} of steps={self.steps}, which overlaps the "
                   f"warmup_steps={self.warmup_steps}; lower one of them", fraction)  # fmt: skip

    def decay_steps(self) -> int:
        """How many of the last steps ``wsd`` decays over: ``decay_fraction`` of them, rounded, at least 1."""
        return max(1, round(self.option("decay_fraction") * self.steps))


def _check(ok: bool, name: str, message: str, got: object) -> None:
    if not ok:
        raise ConfigError(f"{message}, got {got!r}", name)
