"""Which ``key=value`` overrides ``brickwork train --resume RUN`` accepts, and the record of them.

A resumed run goes on with the model its checkpoint holds, on the data it started with, under the
meaning its layout gave the batch; overrides that keep all three are safe: the learning rate and its
schedule, the steps, the evaluation and checkpoint intervals, logging, sampling, compilation and the
layout (``dist.*``, resharded on load). Anything else is refused, naming the key and why. The changes
a resume makes are printed, written into config.yaml, and appended to ``RUN/config_changes.jsonl``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from brickwork.errors import ConfigError
from brickwork.train.atomic_file import replacing
from brickwork.train.resume_check import differences, flatten
from brickwork.train.run_config import SECTIONS, parse_overrides

CHANGES_FILE = "config_changes.jsonl"
SAFE_TRAIN_KEYS = frozenset(
    {
        "steps",
        "lr",
        "min_lr",
        "warmup_steps",
        "schedule",
        "decay_fraction",
        "decay_shape",
        "eval_interval",
        "checkpoint_interval",
        "keep_checkpoints",
        "log_to",
        "sample_prompt",
        "sample_tokens",
        "sample_temperature",
        "compile",
        "checkpoint_on_preempt",
        "async_checkpoint",
        "max_skipped_steps",
    }
)
# Why each refused kind of key would make the resumed run another run.
_WHY = {
    "data": "the run goes on with the data it started with (see --accept-data-change for data that changed)",
    "train": "it changes what the optimizer state and the data order in the checkpoint mean",
}
_MODEL = "the checkpoint holds the weights of the model config.yaml describes"


def check_resume_overrides(overrides: list[str]) -> None:
    """Raise ConfigError naming the first override a resumed run cannot take, and why."""
    for key in parse_overrides(overrides):
        head, _, rest = key.partition(".")
        if head == "dist" or (head == "train" and rest.split(".")[0] in SAFE_TRAIN_KEYS):
            continue
        why = _WHY.get(head, _MODEL) if head in SECTIONS else _MODEL
        safe = ", ".join(f"train.{k}" for k in sorted(SAFE_TRAIN_KEYS))
        raise ConfigError(f"cannot change on --resume: {why}; it may change dist.* and {safe}", key)


def config_changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, list[Any]]:
    """``{dotted key: [old, new]}`` for every leaf of config.yaml that differs (None: absent)."""
    old, new = dict(flatten(saved)), dict(flatten(current))
    return {key: [old.get(key), new.get(key)] for key in differences(saved, current)}


def record_changes(run_dir: Path, step: int, changes: dict[str, list[Any]]) -> None:
    """Append ``{"step", "changes"}`` to the run's change record, rewriting it whole (atomic_file.py)."""
    path = run_dir / CHANGES_FILE
    before = path.read_text(encoding="utf-8") if path.exists() else ""
    line = json.dumps({"step": step, "changes": changes})
    with replacing(path) as tmp:
        tmp.write_text(before + line + "\n", encoding="utf-8")
