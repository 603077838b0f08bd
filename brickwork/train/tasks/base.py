"""A task: how a batch goes into the model, what loss comes out, and what a run makes and reports for it.

A task is the only place a loss is defined. Batches carry HF's labels (a causal LM's are its input
ids); :meth:`Task.align` first turns them into the targets aligned with the positions they score
(the causal LM shifts them into ``shift_labels``), once per batch and before context parallel splits
the sequence, so every layout splits targets that no longer need their neighbour. Each registered
task also says which batch key the first pipeline stage takes, so the same task drives a pipeline:
the schedule feeds that input through the stages and calls :meth:`Task.loss` on the last stage's
output. A user's own task is a callable ``(model, batch) -> (loss_sum, count)`` that gets the batch as
it was given; it cannot be split over pipeline stages.

``brickwork train`` and ``brickwork eval`` ask the task for everything that differs between tasks:
the batches it trains and validates on, whether the run reads text through a tokenizer, what one
sample is, and what it reports (a perplexity, an end-of-run sample). Tasks are registered by name
(:func:`register_task`), one module each in this folder; ``TASKS`` maps the names to them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from brickwork.blocks import MODELS
from brickwork.errors import ConfigError
from brickwork.registry import Registry
from brickwork.train.losses import logits_of, vocab_parallel_cross_entropy

if TYPE_CHECKING:
    from brickwork.data.sources import TextData
    from brickwork.data.task_batches import TaskBatches
    from brickwork.train.run_config import RunConfig

Batch = Mapping[str, torch.Tensor]
LossAndCount = tuple[torch.Tensor, torch.Tensor]
TaskFn = Callable[[nn.Module, Batch], LossAndCount]


class Task:
    """A registered task: ``task(model, task.align(batch)) -> (loss_sum, count)``.

    ``inputs`` are the batch keys the model takes (by HF's names: the ids a task needs beyond
    ``input_ids``, such as ``document_ids`` or ``decoder_input_ids``, among them), ``pipeline_input``
    the one the first pipeline stage takes; ``labels`` is always the target, and ``target_key`` the
    key of the aligned targets after :meth:`align`.

    What a run of it is: ``sample_unit``, what one sample is (``"tokens"``: a sequence, whose tokens
    the rates count; ``"images"``: rates count whole images); ``uses_tokenizer``, whether its data is
    text read through the run's tokenizer; ``perplexity``, whether its loss is a mean negative
    log-likelihood per token, so that its exponential is a perplexity; ``samples_text``, whether the
    model generates text (the end-of-run sample, ``brickwork sample``); ``packs``, whether it trains
    on packed documents (``data.pack``).
    """

    name = ""  # set by register_task
    inputs: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    pipeline_input = ""
    target_key = "labels"
    sample_unit = "tokens"
    uses_tokenizer = True
    perplexity = False
    samples_text = False
    packs = False

    def check(self, batch: Batch) -> None:
        """ValueError naming the keys when the batch lacks one the task needs or has one it ignores."""
        missing = [k for k in (*self.required, "labels") if k not in batch]
        unknown = [k for k in batch if k not in (*self.inputs, "labels")]
        if missing or unknown:
            raise ValueError(
                f"task {self.name!r} takes batch keys {[*self.inputs, 'labels']} "
                f"(required: {[*self.required, 'labels']}); missing {missing}, not understood {unknown}"
            )

    def align(self, batch: Batch) -> Batch:
        """``batch`` checked, with its labels as the targets aligned to the positions they score."""
        self.check(batch)
        return batch

    def model_lengths(self, seq_len: int) -> tuple[int, int]:
        """(source, target): the tokens a row drawn from a window of ``seq_len`` puts through the
        model's encoder (every other model's one sequence) and an encoder-decoder's decoder; what
        the planner prices and MFU counts."""
        return seq_len, seq_len

    def forward(self, model: nn.Module, batch: Batch) -> Any:
        """The model's output on ``batch``."""
        return model(**{k: batch[k] for k in self.inputs if k in batch})

    def loss(self, output: Any, labels: torch.Tensor) -> LossAndCount:
        """(summed loss, count) of the model's output against ``labels``."""
        return vocab_parallel_cross_entropy(logits_of(output), labels)

    def __call__(self, model: nn.Module, batch: Batch) -> LossAndCount:
        """The summed loss and count of an aligned batch (what :meth:`align` returned)."""
        return self.loss(self.forward(model, batch), batch[self.target_key])

    def train_batches(self, run: RunConfig, text: TextData | None) -> TaskBatches:
        """The run's training batches of ``train.batch_size`` rows (resumable), from ``text``'s
        training tokens (None where the task reads no text)."""
        raise NotImplementedError

    def validation_batches(self, run: RunConfig, text: TextData | None) -> list[dict[str, torch.Tensor]]:
        """The run's fixed validation set, ``train.eval_batches`` batches, the same in every run with
        the same settings."""
        raise NotImplementedError

    def describe_data(self, run: RunConfig, text: TextData | None) -> str:
        """Where the run's data comes from, for its log."""
        raise NotImplementedError


TASK_REGISTRY: Registry[Task] = Registry("task", Task)


def register_task(name: str) -> Callable[[type[Task]], type[Task]]:
    """Register a :class:`Task` subclass as ``name`` (``@register_task("my_task")``); it takes the name."""

    def add(cls: type[Task]) -> type[Task]:
        TASK_REGISTRY.register(name, cls)
        cls.name = name
        return cls

    return add


class TaskTable(Mapping[str, Task]):
    """The registered tasks by name, one instance each (a task holds no state)."""

    def __init__(self) -> None:
        self._made: dict[type[Task], Task] = {}

    def __getitem__(self, name: str) -> Task:
        if name not in TASK_REGISTRY:
            raise KeyError(name)
        cls = TASK_REGISTRY.get(name)
        return self._made.setdefault(cls, cls())

    def __iter__(self) -> Iterator[str]:
        return iter(TASK_REGISTRY)

    def __len__(self) -> int:
        return len(TASK_REGISTRY)


TASKS = TaskTable()


def kind_task(kind: str) -> Task:
    """The task a model kind trains on (``MODELS[kind].task``); ``kind`` is one of ``MODELS``."""
    return TASKS[MODELS[kind].task]


def get_task(task: str | Task | TaskFn) -> Task | TaskFn:
    """A task by name, or the task or callable given; ConfigError listing the names otherwise."""
    if isinstance(task, str):
        if task not in TASKS:
            raise ConfigError(
                f"unknown task {task!r}; name a registered one or pass a callable", choices=TASKS, got=task
            )
        return TASKS[task]
    if not callable(task):
        raise TypeError(f"a task is a name or a callable (model, batch) -> (loss_sum, count), got {task!r}")
    return task
