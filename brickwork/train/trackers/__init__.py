"""Where a run's metrics go besides ``metrics.jsonl`` (always written): ``train.log_to`` names them.

A tracker is one file here: a class with a ``package`` to import, built with the run folder, the run's
title and its ``train:`` settings, that takes each metrics record (:class:`Tracker`). Adding one (MLflow,
say) is that file and its line in ``TRACKERS``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from brickwork.train.trackers.base import Tracker, scalars
from brickwork.train.trackers.tensorboard import TensorBoardTracker
from brickwork.train.trackers.wandb import WandbTracker

TRACKERS: dict[str, type] = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker}
ALWAYS = "jsonl"  # metrics.jsonl, which resume and loss.png read


def open_trackers(names: list[str], run_dir: Path, title: str, settings: dict[str, Any]) -> list[Tracker]:
    """One open tracker per name of ``names`` other than ``jsonl``, writing beside ``run_dir``'s metrics."""
    return [TRACKERS[name](run_dir, title, settings) for name in names if name != ALWAYS]


__all__ = ["ALWAYS", "TRACKERS", "Tracker", "open_trackers", "scalars"]
