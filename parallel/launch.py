"""Run a function on N local processes, each inside an initialized process group, with a deadline.

Tests and benchmarks use this instead of ``torchrun``: a hang (a collective one rank never joins)
kills every process and raises :class:`TimeoutError` instead of stalling, and an exception on any
rank comes back with that rank's traceback.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class RankError:
    """What one rank raised: the exception's type name, its message and the formatted traceback."""

    rank: int
    type_name: str
    message: str
    traceback: str


class SpawnError(RuntimeError):
    """One or more ranks raised; ``errors`` holds each rank's :class:`RankError`, first failure first."""

    def __init__(self, errors: list[RankError]) -> None:
        self.errors = errors
        first = errors[0]
        super().__init__(
            f"{len(errors)} rank(s) failed; rank {first.rank} raised "
            f"{first.type_name}: {first.message}\n{first.traceback}"
        )


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    args: tuple,
    results: multiprocessing.Queue,
    backend: str,
    timeout: float,
    threads: int,
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
    )
    torch.set_num_threads(threads)
    try:
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout))
        buffer = io.BytesIO()
        # torch.save keeps tensors inside the bytes, so nothing relies on shared memory of an exited child.
        torch.save(fn(*args), buffer)
        results.put((rank, "ok", buffer.getvalue()))
    except BaseException as error:  # every failure must reach the parent, or it would wait for nothing
        results.put((rank, "error", (type(error).__name__, str(error), traceback.format_exc())))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _collect(
    results: multiprocessing.Queue, processes: list, timeout: float, error_grace: float
) -> dict[int, Any]:
    """Each rank's result or :class:`RankError`, by rank, as they arrive; stops at the deadline, or
    ``error_grace`` seconds after the first error (the others may wait in a collective it never joins)."""
    outcomes: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    while len(outcomes) < len(processes):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            rank, status, payload = results.get(timeout=min(remaining, 1.0))
        except queue.Empty:
            if all(not p.is_alive() for p in processes) and results.empty():
                break
            continue
        if status == "ok":
            outcomes[rank] = torch.load(io.BytesIO(payload), weights_only=True)
        else:
            outcomes[rank] = RankError(rank, *payload)
            deadline = min(deadline, time.monotonic() + error_grace)
    return outcomes


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 120.0,
    backend: str = "gloo",
    raise_errors: bool = True,
    threads_per_rank: int = 1,
    error_grace: float = 15.0,
) -> list[Any]:
    """Call ``fn(*args)`` on ``world_size`` fresh processes and return their results, by rank.

    ``fn`` must be importable (a module-level function); its result must be made of tensors,
    numbers, strings, lists and dicts. Within ``fn`` the default process group is up (gloo unless
    ``backend`` says otherwise). If any rank raises, the others get ``error_grace`` more seconds
    to finish (they may be stuck in a collective), then all are killed and :class:`SpawnError` is raised; with
    ``raise_errors=False`` the list holds a :class:`RankError` in that rank's place instead. If the
    deadline passes first, every process is killed and :class:`TimeoutError` names the missing ranks.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    processes = [
        context.Process(
            target=_worker,
            args=(fn, rank, world_size, port, args, results, backend, timeout, threads_per_rank),
            daemon=True,
        )
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    try:
        outcomes = _collect(results, processes, timeout, error_grace)
    finally:
        for process in processes:
            process.join(timeout=5.0)
            if process.is_alive():
                process.kill()
                process.join()
    missing = [rank for rank in range(world_size) if rank not in outcomes]
    # In arrival order: the first rank to fail is the likeliest cause of the others' errors.
    errors = [o for o in outcomes.values() if isinstance(o, RankError)]
    if errors and raise_errors:
        raise SpawnError(errors)
    if missing:
        codes = {rank: processes[rank].exitcode for rank in missing}
        raise TimeoutError(
            f"ranks {missing} of {world_size} did not finish within {timeout:.0f}s (exit codes {codes}); "
            "a collective was probably never joined by every rank"
        )
    return [outcomes[rank] for rank in range(world_size)]
