"""The tasks a model trains on, one registered module each (docs/architecture.md says how to add one)."""

import importlib
import pkgutil

from .base import TASK_REGISTRY, TASKS, Batch, LossAndCount, Task, TaskFn, get_task, kind_task, register_task
from .causal_lm import CausalLM, fuses_head_loss
from .image_classification import ImageClassification
from .masked_lm import MaskedLM
from .seq2seq import Seq2Seq
from .text import TextTask


def import_task_modules() -> None:
    """Import every module of this folder, so a task added as a module registers itself by being here."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")


import_task_modules()

__all__ = [
    "TASKS",
    "TASK_REGISTRY",
    "Batch",
    "CausalLM",
    "ImageClassification",
    "LossAndCount",
    "MaskedLM",
    "Seq2Seq",
    "Task",
    "TaskFn",
    "TextTask",
    "fuses_head_loss",
    "get_task",
    "import_task_modules",
    "kind_task",
    "register_task",
]
