"""Single-process checkpoints in a run folder, each made visible by a ``.complete`` marker written last.

Layout: ``RUN/checkpoints/step_000200/`` holds ``model.safetensors`` (the full single-process weights,
whatever the layout the run trained under), one ``trainer_rank{r}.pt`` per process (its optimizer
state, RNG states and the data position, loaded with ``weights_only=True``) and ``.complete``. A
folder without the marker is a save that was cut off, and is never resumed from.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from brickwork.errors import ConfigError

MARKER = ".complete"
WEIGHTS_FILE = "model.safetensors"
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


def start_checkpoint(run_dir: Path, step: int) -> Path:
    """An empty folder for the checkpoint of ``step`` (a cut-off earlier attempt is cleared)."""
    folder = checkpoint_dir(run_dir, step)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def weight_aliases(model: torch.nn.Module) -> dict[str, str]:
    """Tied parameters: each later name -> the first name of the same tensor (``lm_head.weight`` ->
    ``token_embedding.weight``). The weights file stores a tied tensor once."""
    first: dict[int, str] = {}
    aliases = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            aliases[name] = first[id(param)]
        else:
            first[id(param)] = name
    return aliases


def save_weights(state: dict[str, torch.Tensor], aliases: dict[str, str], path: Path) -> None:
    """Write full (single-process) weights as safetensors, each tied tensor once."""
    save_file({k: v.detach().cpu().contiguous() for k, v in state.items() if k not in aliases}, str(path))


def load_weights(model: torch.nn.Module, path: Path) -> None:
    """Load a weights file written by :func:`save_weights` into ``model``, strictly."""
    state = load_file(str(path))
    for alias, name in weight_aliases(model).items():
        if name in state:
            state[alias] = state[name]
    model.load_state_dict(state, strict=True)


def trainer_state_path(folder: Path, rank: int) -> Path:
    return folder / f"trainer_rank{rank}.pt"


def load_trainer_state(folder: Path, rank: int) -> dict[str, Any]:
    """This rank's optimizer, RNG and data state; loaded with ``weights_only=True``."""
    path = trainer_state_path(folder, rank)
    if not path.is_file():
        raise ConfigError(
            f"{str(folder)!r} holds no state for rank {rank}; resume with the processes it was saved with",
            "--resume",
        )
    return torch.load(path, weights_only=True)
