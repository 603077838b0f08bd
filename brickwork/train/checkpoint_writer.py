"""How the training loop saves its checkpoints: at once, or while training goes on
(``train.async_checkpoint``).

A synchronous save returns with the checkpoint complete, after which rank 0 prunes (retention.py). An
asynchronous one returns once the state is copied to CPU memory; a background thread writes it, rank
0 then writes the manifest and marker, and only after that verifies the new checkpoint and prunes the
old ones, as retention.py does after a synchronous save. So a checkpoint counts (``.complete``,
visible to a resume) only once its write has completed, and pruning never runs ahead of it.

At most one asynchronous save is in flight: the next save, the end of the loop, a preemption's save
and any error leaving the loop first wait for it, and its error is raised then, never dropped (while
another error leaves the loop, the save's error is raised with that one as its context).
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from brickwork.checkpoint import checkpoint_dir
from brickwork.parallel import save_checkpoint
from brickwork.parallel.checkpoint import async_save_checkpoint, save_group
from brickwork.parallel.checkpoint.async_save import then
from brickwork.train.checkpoint import save_run_checkpoint, write_failed
from brickwork.train.retention import retain


@dataclass(frozen=True)
class _InFlight:
    """An asynchronous save: the step, its folder, the write (ending with the complete folder) and
    what ends after it: on rank 0 the pruning, on the other ranks the write itself."""

    step: int
    folder: Path
    written: Future[Path]
    retained: Future[Any]


class CheckpointWriter:
    """``with CheckpointWriter(run_dir, keep, is_main, asynchronous, timeout_s) as writer:`` saves with
    :meth:`save`; leaving the block waits for a save in flight. Every rank enters it and calls
    :meth:`save` at the same steps; ``keep`` is ``train.keep_checkpoints``, ``timeout_s`` how long the
    asynchronous write's collectives wait for a peer (the layout's)."""

    def __init__(self, run_dir: Path, keep: int, is_main: bool, asynchronous: bool, timeout_s: float) -> None:
        self.run_dir = run_dir
        self.keep = keep
        self.is_main = is_main
        self.asynchronous = asynchronous
        self.timeout_s = timeout_s
        self._group: dist.ProcessGroup | None = None
        self._in_flight: _InFlight | None = None

    def __enter__(self) -> CheckpointWriter:
        if self.asynchronous:
            self._group = save_group(self.timeout_s)
        return self

    def save(
        self,
        step: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        data_state: dict[str, torch.Tensor],
        val_loss: float,
        settings: Mapping[str, Any] | None = None,
        step_state: Mapping[str, Any] | None = None,
    ) -> Path:
        """Save the checkpoint of ``step`` (``save_run_checkpoint``'s arguments) and prune after it;
        returns its folder. Asynchronous, the folder is complete once :meth:`wait` has returned on rank 0
        (the other ranks' :meth:`wait` returns once every rank's files are written)."""
        self.wait()
        write = partial(async_save_checkpoint, group=self._group) if self.asynchronous else save_checkpoint
        written = save_run_checkpoint(
            self.run_dir, step, model, optimizer, data_state, val_loss, settings, step_state, write=write
        )
        if not self.asynchronous:
            if self.is_main:
                retain(self.run_dir, written, self.keep)
            return written
        retained = written
        if self.is_main:
            retained = then(written, lambda: retain(self.run_dir, written.result(), self.keep))
        self._in_flight = _InFlight(step, checkpoint_dir(self.run_dir, step), written, retained)
        return self._in_flight.folder

    def wait(self) -> None:
        """Wait for the save in flight, if any, and its pruning; raise what either raised (a failed
        write as ``save_run_checkpoint`` raises it, after rank 0 removed its partial folder)."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            return
        failure = None
        try:
            in_flight.written.result()
        except (OSError, RuntimeError, CheckpointException) as err:
            failure = write_failed(err, in_flight.step, in_flight.folder)
        if failure is not None:
            # Raised here, not in the except clause: an error leaving the loop stays its context.
            raise failure
        in_flight.retained.result()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.wait()
