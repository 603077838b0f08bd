"""``train.log_to: [tensorboard]``: every number of a record as a TensorBoard scalar at its step, in
``RUN/tensorboard``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from brickwork.train.trackers.base import scalars


class TensorBoardTracker:
    """TensorBoard event files in ``run_dir / "tensorboard"``; a resumed run appends new ones there."""

    package = "tensorboard"

    def __init__(self, run_dir: Path, title: str, settings: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter  # imports the tensorboard package

        self.events = SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, record: dict[str, Any]) -> None:
        for key, value in scalars(record).items():
            self.events.add_scalar(key, value, record["step"])
        self.events.flush()

    def close(self) -> None:
        self.events.close()
