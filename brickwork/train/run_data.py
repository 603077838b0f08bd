"""A run's text data: its tokenizer and token streams, ready before the model is built.

The model's vocabulary follows the tokenizer, so the data comes first; and it comes before the run
folder holds anything, so bad data stops the run with nothing written. Under torchrun rank 0 reads
(and tokenises into the run's cache) first, then the others read what it wrote. A resumed run's data
is first compared with what the run started with (brickwork/train/data_identity.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch.distributed as dist

from brickwork.data.sources import TextData, declared_tokenizer, open_text_data
from brickwork.data.tokenizer import Tokenizer
from brickwork.launch_env import world_size
from brickwork.parallel import ParallelConfig, build_mesh
from brickwork.train.data_identity import DataIdentity, check_data_identity, current_record
from brickwork.train.run_config import RunConfig, task_spec

if TYPE_CHECKING:
    from brickwork.train.run import Run


class RunData(NamedTuple):
    """A run's text data (None for a task that reads no text, the generated images) and what it is."""

    text: TextData | None
    identity: DataIdentity


def run_tokenizer(run: RunConfig) -> Tokenizer:
    """The tokenizer of ``run``'s text data: ``data.tokenizer``, or what the data declares."""
    return declared_tokenizer(run.data.path, run.data.tokenizer, run.spec.get("vocab_size"))


def run_data(run: Run, run_dir: Path, resumed_at: int | None, accept_change: bool) -> RunData:
    """The data of ``run``; under torchrun the process group starts from the run's layout. A run
    resumed at step ``resumed_at`` has it checked against its data record first, before anything is
    written, the token cache included (brickwork/train/data_identity.py)."""
    tokenizer = run.tokenizer
    current = current_record(run.config.data, tokenizer)
    identity = check_data_identity(run_dir, current, tokenizer, resumed_at, accept_change)
    if resumed_at is not None and tokenizer is not None:
        # A run folder from before data.json has no record to refuse a tokenizer of another size by; the
        # vocabulary config.yaml gives the model must still have a row for every id of the data.
        task_spec(run.config, run.task, tokenizer, quiet=True)
    text = None if tokenizer is None else run_text_data(run.config, run.layout, run_dir, tokenizer)
    return RunData(text, identity)


def run_text_data(run: RunConfig, layout: ParallelConfig, run_dir: Path, tokenizer: Tokenizer) -> TextData:
    """The text data of ``run``, read with ``tokenizer``; token files are cached in ``run_dir / "cache"``."""
    cache = run_dir / "cache"
    return on_rank0_first(layout, lambda: open_text_data(run.data, tokenizer, cache, run.train.seq_len))


def on_rank0_first(layout: ParallelConfig, prepare: Callable[[], TextData]) -> TextData:
    """``prepare()`` on rank 0 (which writes the token cache), then on the others (which find it). An
    error on rank 0 reaches every rank, so none waits for a rank that has stopped."""
    if world_size() == 1:
        return prepare()
    if not dist.is_initialized():
        build_mesh(layout)  # starts the process group that parallelize reuses
    failure: list[str | None] = [None]
    if dist.get_rank() == 0:
        try:
            result = prepare()
        except ValueError as err:  # ConfigError included: a problem with the data
            failure[0] = str(err)
            dist.broadcast_object_list(failure, src=0)
            raise
    dist.broadcast_object_list(failure, src=0)
    if failure[0] is not None:
        raise ValueError(failure[0])
    return result if dist.get_rank() == 0 else prepare()
