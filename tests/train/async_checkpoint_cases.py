"""Pieces of the asynchronous checkpoint tests: a gate that holds DCP's file writes, reading every
tensor of a checkpoint in one process, and what spawned ranks run (an importable module)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from train_cases import build, global_batches, share

from brickwork.checkpoint.folder import open_checkpoint
from brickwork.checkpoint.safe_reader import SafeLoadPlanner
from brickwork.parallel import parallelize
from brickwork.train import TrainStep
from brickwork.train.checkpoint import save_run_checkpoint
from brickwork.train.checkpoint_writer import CheckpointWriter


@contextlib.contextmanager
def held_writes() -> Iterator[tuple[threading.Event, threading.Event]]:
    """While inside, DCP's file writes wait at their start until the yielded ``release`` is set; the
    yielded ``held`` is set once one is waiting. ``release`` is set on leaving, so nothing is left hanging."""
    held, release = threading.Event(), threading.Event()
    write = FileSystemWriter.write_data

    def gated(self: FileSystemWriter, *args: Any, **kwargs: Any) -> Any:
        held.set()
        if not release.wait(timeout=120):
            raise TimeoutError("the test never released the held write")
        return write(self, *args, **kwargs)

    try:
        with mock.patch.object(FileSystemWriter, "write_data", gated):
            yield held, release
    finally:
        release.set()


def stored_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint in ``folder`` (``model.*`` and ``optim.*``), whole, read in this
    one process through DCP, plus each rank's saved RNG state (``rng.<file>.<key>``)."""
    folder, _, reader, stored = open_checkpoint(folder)
    state = {
        key: torch.empty(tuple(md.size), dtype=md.properties.dtype)
        for key, md in stored.items()
        if isinstance(md, TensorStorageMetadata)
    }
    dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
    for file in sorted((folder / "rng").iterdir()):
        for key, value in torch.load(file, weights_only=True).items():
            state[f"rng.{file.stem}.{key}"] = value
    return state


def sync_and_held_async(root: str, cases: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """On every rank, for each (key, dist dict): one step, then the checkpoint of step 1 saved at once
    into root/key/sync and asynchronously into root/key/async, whose write is held while two more
    steps change the weights. Reports, per key, whether the async folder was complete while held."""
    batches = global_batches("decoder")
    out = {}
    for key, layout in cases:
        model = parallelize(build("decoder"), layout)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        step = TrainStep(model, opt, "causal_lm")
        step(share(model, batches[0]))
        args = (model, opt, {}, 1.0)
        save_run_checkpoint(Path(root) / key / "sync", 1, *args)
        with (
            held_writes() as (held, release),
            CheckpointWriter(Path(root) / key / "async", 0, dist.get_rank() == 0, True, 60) as writer,
        ):
            folder = writer.save(1, *args)
            for batch in batches[1:]:
                step(share(model, batch))
            if not held.wait(timeout=60):
                raise TimeoutError("the write never started")
            out[key] = {"complete_while_held": (folder / ".complete").exists()}
            release.set()
        dist.barrier()
    return out
