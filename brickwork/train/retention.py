"""Which checkpoints a run keeps: the newest ``keep`` complete ones, and the best one in ``best/``.

After each save, rank 0 calls :func:`retain`. Nothing is deleted before the new checkpoint is complete
and its files match its manifest. ``RUN/checkpoints/best/`` holds a copy of the checkpoint with the
lowest validation loss so far, so pruning the step folders never loses it; its files are hard links
to the step folder's where the file system allows (a save never rewrites a finished file: a step is
saved again only into a fresh folder), so the copy costs no space. ``best/`` is replaced by renames,
never left half-written. Symbolic links are never followed, counted or deleted.

A pruned folder loses its ``.complete`` marker before anything else, so a kill during the deletion
leaves a folder that is plainly unfinished, like a save a kill cut off; :func:`remove_unfinished`
deletes those when the run starts again.
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

from brickwork.checkpoint import (
    COMPLETE_MARKER,
    CorruptCheckpointError,
    complete_checkpoints,
    folder_step,
    is_complete,
    read_meta,
    verify_checkpoint,
)
from brickwork.train.checkpoint import remove_path

BEST_DIR = "best"


def retain(run_dir: Path, newest: Path, keep: int) -> None:
    """Verify ``newest``, make it ``best/`` if its validation loss is the lowest so far, then delete all
    but the newest ``keep`` complete step folders (``keep=0`` keeps every one). Rank 0 only."""
    verify_checkpoint(newest)
    update_best(run_dir, newest)
    if keep <= 0:
        return
    for _, folder in complete_checkpoints(run_dir)[:-keep]:
        (folder / COMPLETE_MARKER).unlink()
        shutil.rmtree(folder)


def remove_unfinished(run_dir: Path) -> list[str]:
    """Delete the step folders without a ``.complete`` marker (a save or a deletion that a kill cut
    off: nothing reads them) and return their names. Rank 0 calls it, holding the run's lock, before
    a resumed run writes anything."""
    root = run_dir / "checkpoints"
    if not root.is_dir() or root.is_symlink():
        return []
    removed = []
    for folder in sorted(root.iterdir()):
        step_folder = folder_step(folder) is not None and folder.is_dir() and not folder.is_symlink()
        if step_folder and not is_complete(folder):
            shutil.rmtree(folder)
            removed.append(folder.name)
    return removed


def best_checkpoint(run_dir: Path) -> Path | None:
    """``RUN/checkpoints/best`` when it holds a complete checkpoint, else None."""
    best = run_dir / "checkpoints" / BEST_DIR
    return best if not best.is_symlink() and is_complete(best) else None


def validation_loss(folder: Path) -> float | None:
    """The validation loss a checkpoint was saved with; None when unknown or not finite."""
    try:
        value = read_meta(folder).get("extra", {}).get("val_loss")
    except CorruptCheckpointError:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def update_best(run_dir: Path, newest: Path) -> bool:
    """Copy ``newest`` to ``best/`` if its validation loss is below the current best's; True if it was."""
    loss = validation_loss(newest)
    if loss is None:
        return False
    root = run_dir / "checkpoints"
    best, staged, old = root / BEST_DIR, root / f"{BEST_DIR}.tmp", root / f"{BEST_DIR}.old"
    if not _exists(best) and is_complete(old) and not old.is_symlink():
        os.replace(old, best)  # a replacement was cut off between its two renames
    current = best_checkpoint(run_dir)
    current_loss = validation_loss(current) if current is not None else None
    if current_loss is not None and current_loss <= loss:
        return False
    for leftover in (staged, old):
        remove_path(leftover)
    shutil.copytree(newest, staged, copy_function=_link_or_copy)
    verify_checkpoint(staged)
    if _exists(best):
        os.replace(best, old)
    os.replace(staged, best)
    remove_path(old)
    return True


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system, or one without hard links
        shutil.copy2(source, target)


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()
