"""The ``brickwork train`` job: run configs, the training loop, run folders, checkpoints and resume."""

from brickwork.train.config import DataConfig, TrainConfig
from brickwork.train.optim import build_optimizer, learning_rate

__all__ = ["DataConfig", "TrainConfig", "build_optimizer", "learning_rate"]
