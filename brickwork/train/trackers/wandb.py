"""``train.log_to: [wandb]``: the records as a Weights & Biases run, its files in ``RUN/wandb``.

``WANDB_MODE=offline`` (or no login) keeps it on this machine, for ``wandb sync`` later; the project is
``WANDB_PROJECT``, else ``brickwork``. The run's id is derived from the run folder, so a resumed run
goes on with the same W&B run rather than starting a second one.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from brickwork.train.trackers.base import scalars


class WandbTracker:
    """A W&B run named ``title``, configured with the run's ``train:`` settings."""

    package = "wandb"

    def __init__(self, run_dir: Path, title: str, settings: dict[str, Any]) -> None:
        import wandb

        folder = str(run_dir.resolve())
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "brickwork"),
            name=title,
            id=hashlib.sha1(folder.encode()).hexdigest()[:16],
            resume="allow",
            dir=folder,
            config=settings,
        )

    def log(self, record: dict[str, Any]) -> None:
        self.run.log(scalars(record), step=record["step"])

    def close(self) -> None:
        self.run.finish()
