"""Training: the one train step and evaluation for every model family and layout, and the
``brickwork train`` job (run configs, the loop, run folders, checkpoints and resume)."""

from brickwork.data.config import DataConfig
from brickwork.train.config import TrainConfig
from brickwork.train.losses import IGNORE_INDEX, vocab_parallel_cross_entropy
from brickwork.train.optim import build_optimizer, learning_rate
from brickwork.train.step import TrainStep, evaluate
from brickwork.train.tasks import TASKS, Task

__all__ = [
    "IGNORE_INDEX",
    "TASKS",
    "DataConfig",
    "Task",
    "TrainConfig",
    "TrainStep",
    "build_optimizer",
    "evaluate",
    "learning_rate",
    "vocab_parallel_cross_entropy",
]
