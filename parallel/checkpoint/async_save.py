"""Saving a checkpoint while training goes on: DCP's ``async_save`` behind the folder format of
save_load.py.

The state is copied to CPU memory before :func:`async_save_checkpoint` returns (DCP's staging), so
the step after it may change the weights at once; a thread of DCP's writes the copy, and rank 0 then
writes ``meta.json``, the manifest and ``.complete`` as a synchronous save does. Until then the
folder has no marker: nothing loads it, and a crash leaves it as unfinished as a cut-off synchronous
save.

The write's collectives (DCP gathers every rank's plan, then every rank's written files) run on a
process group of their own, a gloo one, for two reasons: DCP's background write needs a CPU backend
(NCCL has none), and the training step's collectives on the default group, running meanwhile in the
main thread, must never interleave with them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from brickwork.checkpoint.folder import quiet_single_process
from brickwork.parallel.checkpoint.save_load import prepare_save

T = TypeVar("T")


def save_group(timeout_s: float) -> dist.ProcessGroup | None:
    """A gloo group of every rank for :func:`async_save_checkpoint`'s collectives, whose waits give up
    after ``timeout_s`` like the layout's; None without a process group. Every rank calls it (it is
    collective), once per run: each group holds its own connections."""
    if not dist.is_initialized():
        return None
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))


def async_save_checkpoint(
    directory: str | os.PathLike,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    step: int,
    *,
    extra: Mapping[str, Any] | None = None,
    group: dist.ProcessGroup | None = None,
) -> Future[Path]:
    """``save_checkpoint`` that returns once the state is staged; every rank calls it.

    The returned future's result is the folder: on rank 0 once it has written ``meta.json``, the
    manifest and ``.complete``, on the other ranks once every rank's files are written. Its exception
    is what the write raised (on every rank: DCP gathers the failures). ``group`` is
    :func:`save_group`'s; there must be at most one save in flight per group, so wait for the last
    future before the next save. The staged copy holds this rank's share of the model and optimizer
    state in CPU memory until the write ends.
    """
    pending = prepare_save(directory, model, optimizer, step, extra)
    with quiet_single_process():
        written = dcp.async_save(
            pending.state,
            checkpoint_id=pending.folder,
            process_group=group,
            no_dist=not dist.is_initialized(),
        )
    # DCP's coordinator (rank 0) ends the write only after every rank reported its files, and each
    # rank wrote its RNG file before it started: rank 0 may finish the folder as soon as it is done.
    return then(written, pending.finish)


def then(future: Future[Any], after: Callable[[], T]) -> Future[T]:
    """A future that ends with ``after()`` once ``future`` has succeeded, or with ``future``'s error (or
    ``after``'s): nothing either raises is lost. ``after`` runs in the thread that ends ``future``."""
    chained: Future[T] = Future()

    def done(finished: Future[Any]) -> None:
        try:
            finished.result()
            chained.set_result(after())
        except BaseException as err:  # handed on whole to whoever waits on ``chained``
            chained.set_exception(err)

    future.add_done_callback(done)
    return chained
