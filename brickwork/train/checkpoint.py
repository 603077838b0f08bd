"""Single-process checkpoints in a run folder, each made visible by a ``.complete`` marker written last.

Layout: ``RUN/checkpoints/step_000200/`` holds ``model.safetensors`` (the weights), ``trainer.pt``
(optimizer, data position and RNG states, loaded with ``weights_only=True``) and ``.complete``. A
folder without the marker is a save that was cut off, and is never resumed from.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_model, save_model

from brickwork.errors import ConfigError

MARKER = ".complete"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:06d}"


def complete_checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every checkpoint whose marker exists, oldest first."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for folder in root.iterdir():
        match = _STEP_DIR.match(folder.name)
        if match and (folder / MARKER).is_file():
            found.append((int(match.group(1)), folder))
    return sorted(found)


def latest_checkpoint(run_dir: Path) -> tuple[int, Path]:
    """The newest complete checkpoint of ``run_dir``; a one-line ConfigError when there is none."""
    found = complete_checkpoints(run_dir)
    if not found:
        raise ConfigError(
            f"{str(run_dir)!r} has no complete checkpoint (no checkpoints/step_*/{MARKER}); "
            "start a new run instead, or lower train.checkpoint_interval so that runs save one sooner",
            "--resume",
        )
    return found[-1]


def mark_complete(folder: Path, step: int) -> None:
    """Write the marker atomically: a temporary file renamed into place after the data is on disk."""
    for file in folder.iterdir():
        if file.is_file():
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())
    temp = folder / f"{MARKER}.tmp"
    temp.write_text(f"{step}\n")
    os.replace(temp, folder / MARKER)


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` complete checkpoints (``keep=0`` keeps every one)."""
    if keep <= 0:
        return
    for _, folder in complete_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(folder)


def save_checkpoint(run_dir: Path, step: int, model: torch.nn.Module, trainer_state: dict[str, Any]) -> Path:
    """Save weights and ``trainer_state`` (tensors, numbers, strings, lists, dicts) for ``step``."""
    folder = checkpoint_dir(run_dir, step)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    save_model(model, str(folder / "model.safetensors"))
    torch.save(trainer_state, folder / "trainer.pt")
    mark_complete(folder, step)
    return folder


def load_checkpoint(folder: Path, model: torch.nn.Module) -> dict[str, Any]:
    """Load the weights into ``model`` (strictly) and return the trainer state."""
    load_model(model, str(folder / "model.safetensors"), strict=True)
    return torch.load(folder / "trainer.pt", weights_only=True)
