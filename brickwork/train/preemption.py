"""Stopping a run cleanly when its scheduler asks: SIGTERM, or SIGUSR1 (Slurm's warning signal).

Either signal only sets a flag. The training loop asks :meth:`StopSignals.agreed` at each step
boundary; under torchrun every rank answers the same, because torchrun forwards a signal to every
rank but each may receive it during another step. The ranks agree through one all-reduce of a
one-element tensor per step, started at one boundary and read at the next: it completes while the
step runs, so no rank waits for it, and a stop comes one step after the first rank saw the signal.
The loop then saves a checkpoint of that step (unless ``train.checkpoint_on_preempt`` is false) and
raises :class:`Preempted`, which ``brickwork train`` reports in one line before exiting with 128 + the
signal's number: the status a shell reports for a process that signal killed, which is what a
scheduler's requeue logic expects. SIGINT (Ctrl-C) is not handled here: it stops the run at once.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType, TracebackType

import torch
import torch.distributed as dist

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preempted(Exception):
    """The run stopped at the boundary after ``step`` on ``signum``; ``checkpoint`` is the folder saved
    there, or None when ``train.checkpoint_on_preempt`` is false."""

    def __init__(self, signum: int, step: int, steps: int, checkpoint: Path | None, run_dir: Path) -> None:
        self.signum = signum
        self.step = step
        self.checkpoint = checkpoint
        name = signal.Signals(signum).name
        if checkpoint is not None:
            saved = f"its checkpoint is {checkpoint}"
        else:
            saved = "no checkpoint was saved there (train.checkpoint_on_preempt is false)"
        super().__init__(
            f"stopped by {name} after step {step} of {steps}; {saved}; continue with --resume {run_dir}"
        )

    @property
    def exit_status(self) -> int:
        """128 + the signal's number, as a shell reports a process that the signal killed."""
        return 128 + self.signum


class StopSignals:
    """``with StopSignals(device) as stop:`` records SIGTERM and SIGUSR1 instead of dying of them, and
    restores the earlier handlers when the block ends. ``device`` is where the run's collectives
    compute (a CUDA device under NCCL).

    Handlers can only be installed from the main thread; elsewhere (a trainer called from a thread)
    the signals keep their earlier handlers and :meth:`agreed` reads only what other ranks saw. A
    signal that comes after the last boundary the loop asks about changes nothing: the run has
    finished its steps.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.received = 0
        self._previous: dict[int, object] = {}
        # The all-reduce started at the last boundary: (its tensor, its work handle).
        self._exchange: tuple[torch.Tensor, dist.Work] | None = None

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._receive) for s in STOP_SIGNALS}
        return self

    def _receive(self, signum: int, frame: FrameType | None) -> None:
        # The first signal names the stop; a second one (torchrun repeats its SIGTERM) changes nothing.
        self.received = self.received or signum

    def agreed(self) -> int:
        """The signal every rank stops for at this boundary (0: go on); the same number on every rank.
        Under torchrun it is what the ranks had received by the previous boundary. Every rank must
        call it at the same boundaries, like any collective."""
        if not (dist.is_initialized() and dist.get_world_size() > 1):
            return self.received
        signum = 0
        if self._exchange is not None:
            flag, work = self._exchange
            work.wait()
            signum = int(flag.item())
        self._exchange = None
        if not signum:
            flag = torch.tensor([self.received], dtype=torch.int32, device=self.device)
            self._exchange = flag, dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True)
        return signum

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
        if self._exchange is not None and kind is None:
            self._exchange[1].wait()  # every rank started it; none leaves it running
        self._exchange = None
