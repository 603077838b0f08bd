"""The checkpoints of a ``brickwork train`` run folder: ``RUN/checkpoints/step_000200/``, one per saved
step, and the newest one that is complete and intact.

A symbolic link under ``checkpoints/`` is not a checkpoint the run wrote: it is never listed, so it is
never resumed from, loaded or deleted.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import NamedTuple

from brickwork.checkpoint.folder import META_FILE, is_complete, read_meta, verify_checkpoint
from brickwork.checkpoint.manifest import CorruptCheckpointError
from brickwork.errors import ConfigError
from brickwork.launch_env import is_first_rank

_STEP_FOLDER = re.compile(r"^step_(\d+)$")
logger = logging.getLogger(__name__)


class SavedCheckpoint(NamedTuple):
    """A checkpoint of a run folder: the step it saved, and its folder."""

    step: int
    folder: Path


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """Where the run in ``run_dir`` keeps the checkpoint of ``step``."""
    return run_dir / "checkpoints" / f"step_{step:06d}"


def folder_step(folder: Path) -> int | None:
    """The step a folder named ``step_<N>`` is for; None for any other name."""
    match = _STEP_FOLDER.match(folder.name)
    return int(match.group(1)) if match else None


def complete_checkpoints(run_dir: Path) -> list[SavedCheckpoint]:
    """Every checkpoint whose save finished, oldest first; symbolic links are left out."""
    root = run_dir / "checkpoints"
    if not root.is_dir() or root.is_symlink():
        return []
    found = []
    for folder in root.iterdir():
        step = folder_step(folder)
        if step is not None and not folder.is_symlink() and is_complete(folder):
            found.append(SavedCheckpoint(step, folder))
    return sorted(found)


def check_step_folder(folder: Path, option: str = "--resume") -> int:
    """The step of the checkpoint folder ``step_<N>``: a real folder (not a symbolic link) whose
    ``meta.json`` says step N. Raises ConfigError naming the folder otherwise."""
    if folder.is_symlink():
        raise ConfigError(f"{str(folder)!r} is a symbolic link, not a checkpoint this run wrote", option)
    named = folder_step(folder)
    saved = read_meta(folder)["step"]
    if named is not None and named != saved:
        raise CorruptCheckpointError(
            f"{folder / META_FILE} says step {saved}, but the folder is named for step {named}"
        )
    return saved


def latest_checkpoint(run_dir: Path, option: str = "--resume", *, intact: bool = False) -> SavedCheckpoint:
    """The newest complete checkpoint of ``run_dir``; a one-line ConfigError naming ``option`` when
    there is none. With ``intact``, checkpoints whose files fail their manifest are skipped, each
    reported in one line, and the newest intact one is returned."""
    found = complete_checkpoints(run_dir)
    if not found:
        raise ConfigError(
            f"{str(run_dir)!r} has no complete checkpoint (no checkpoints/step_*/.complete); "
            "start a new run instead, or lower train.checkpoint_interval so that runs save one sooner",
            option,
        )
    if not intact:
        return found[-1]
    damaged = []
    for saved in reversed(found):
        folder = saved.folder
        try:
            verify_checkpoint(folder)
            check_step_folder(folder, option)
        except CorruptCheckpointError as err:
            damaged.append(str(err))
            continue
        for reason in damaged:
            _say(f"skipping a damaged checkpoint: {reason}; using {folder.name}, the newest intact one")
        return saved
    raise ConfigError(
        f"every complete checkpoint of {str(run_dir)!r} is damaged: " + "; ".join(damaged), option
    )


def _say(line: str) -> None:
    if is_first_rank():
        logger.info(line)
