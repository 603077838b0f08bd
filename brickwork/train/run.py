"""The resolved run: what ``brickwork train`` trains by, resolved once per process and handed down.

The resolution goes in steps, each a ``dataclasses.replace`` of the frozen RunConfig
(brickwork/train/run_config.py): the task the spec's model kind trains on; ``dist: auto``, the
planner's layout for the launched world (brickwork/train/auto_dist.py); the dist dict checked
against that world; the model spec resolved as the model is built from it. Nothing after the
resolution re-reads or changes the run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from brickwork.blocks import MODELS
from brickwork.data.tokenizer import Tokenizer
from brickwork.errors import ConfigError
from brickwork.factory import resolve_spec
from brickwork.parallel import ParallelConfig
from brickwork.train.auto_dist import choose_layout, wants_auto
from brickwork.train.config import TrainConfig
from brickwork.train.distributed import check_world
from brickwork.train.run_config import RunConfig, task_spec
from brickwork.train.run_data import run_tokenizer
from brickwork.train.tasks import Task, kind_task


@dataclass(frozen=True)
class Run:
    """A run as ``brickwork train`` resolved it, the one object the stages after the resolution read.

    ``config`` is what config.yaml records (``config.to_dict()``): its ``dist`` is the dist dict as
    checked against the launched world, every key spelled out, and its model ``spec`` is resolved
    (defaults filled in, ``vocab_size`` the tokenizer's), the ``.spec`` of the model built from it.
    ``layout`` is that dist dict's ParallelConfig with the device of ``train.device`` and FSDP's bf16
    policy (``train.precision`` bf16-mixed or fp8 under ZeRO-2/3) folded in: the checks, the data, the
    process group, ``parallelize`` and the step are all handed this one. ``task`` is what the model
    kind trains on; ``tokenizer`` its data's, read once (None for a task that reads no text).
    """

    config: RunConfig
    layout: ParallelConfig
    task: Task
    tokenizer: Tokenizer | None

    def plot_title(self, run_dir: Path) -> str:
        """The title of the loss plot, and of the trackers' runs, of this run trained in ``run_dir``."""
        return f"{self.config.name}: {run_dir.name}"


def run_task(config: RunConfig) -> Task:
    """The task the spec's model kind trains on (``MODELS[kind].task``), with the data made for it."""
    kind = config.spec.get("model")
    if kind not in MODELS:
        raise ConfigError(f"brickwork train has no task for model {kind!r}", "model", choices=MODELS)
    MODELS[kind].check_trainable(config.spec)
    return kind_task(kind)


def with_auto_dist(config: RunConfig, task: Task) -> RunConfig:
    """``dist: auto``: ``config`` with the planner's dist dict for the launched world (config.yaml
    records the choice); any other ``config`` as it is."""
    if not wants_auto(config.dist):
        return config
    tokenizer = run_tokenizer(config) if task.uses_tokenizer else None
    lengths = task.model_lengths(config.train.seq_len)
    chosen = choose_layout(task_spec(config, task, tokenizer, quiet=True), config.dist, config.train, lengths)
    return replace(config, dist=chosen)


def resolve(config: RunConfig, task: Task, resumed: bool = False) -> Run:
    """The run of ``config``, whose ``dist: auto`` is already chosen: its dist dict checked against the
    processes launched, once; its spec resolved, a new run's for the data's tokenizer (saying so when
    that changes ``vocab_size``). A ``resumed`` run's vocabulary is its config.yaml's: a tokenizer that
    no longer fits it is the data-identity check's to explain (brickwork/train/data_identity.py)."""
    checked = check_world(config.dist)
    config = replace(config, dist=checked.to_dict())
    tokenizer = run_tokenizer(config) if task.uses_tokenizer else None
    spec = config.spec if resumed else task_spec(config, task, tokenizer)
    config = replace(config, spec=resolve_spec(spec))
    return Run(config, _with_train_settings(checked, config.train), task, tokenizer)


def _with_train_settings(layout: ParallelConfig, train: TrainConfig) -> ParallelConfig:
    """``layout`` on the device ``train.device`` names (``auto`` leaves the layout's choice), with FSDP
    keeping bf16 weights for ``train.precision`` bf16-mixed and fp8 under ZeRO-2/3."""
    settings: dict[str, str] = {}
    if train.device != "auto":
        settings["device_type"] = train.device
    if train.precision in ("bf16-mixed", "fp8") and layout.zero_stage >= 2:
        settings["mixed_precision"] = "bf16"
    return replace(layout, **settings) if settings else layout
