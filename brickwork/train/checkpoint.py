"""Saving and loading a run's checkpoints: a ``brickwork.parallel`` distributed checkpoint per saved
step, ``RUN/checkpoints/step_000200/`` (brickwork/checkpoint/folder.py says what one holds;
brickwork/checkpoint/run_folder.py finds them and the newest intact one).

What the trainer needs beyond the model and optimizer rides in the checkpoint's ``extra``: the batch
generator's state (the data position), the last validation loss, and the train step's own state
(``TrainStep.state_dict``: the fp16 loss scaler's). The learning rate is a function of the step, so
the step is the whole schedule state. A checkpoint saved before the step's state was kept loads with
the step as it was built (a fresh loss scaler).
"""

from __future__ import annotations

import base64
import math
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from brickwork.checkpoint import (
    META_FILE,
    CorruptCheckpointError,
    check_step_folder,
    checkpoint_dir,
    export,
    folder_step,
    is_complete,
    latest_checkpoint,
)
from brickwork.errors import ConfigError, RunFailure
from brickwork.parallel import load_checkpoint, save_checkpoint
from brickwork.train.peers import is_peer_failure

if TYPE_CHECKING:
    from brickwork.train.step import TrainStep

T = TypeVar("T")

# Bumped when the trainer's ``extra`` changes shape, so an old checkpoint is refused by name.
TRAINER_FORMAT = 1


class LoadedCheckpoint(NamedTuple):
    """What loading a run's checkpoint gives besides the weights: the checkpoint's meta dict, the
    batch generator's state, and the validation loss at the save."""

    meta: dict[str, Any]
    data_state: dict[str, torch.Tensor]
    val_loss: float


class CheckpointWriteError(RunFailure):
    """A checkpoint could not be written (out of disk space, a file size limit); its partial folder was
    removed and the earlier checkpoints are as they were."""


def save_run_checkpoint(
    run_dir: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    data_state: dict[str, torch.Tensor],
    val_loss: float,
    settings: Mapping[str, Any] | None = None,
    step_state: Mapping[str, Any] | None = None,
    *,
    write: Callable[..., T] = save_checkpoint,
) -> T:
    """Save the checkpoint of ``step``; every rank calls it. Each rank writes its own shards; rank 0
    clears a cut-off earlier attempt at the same step first, and writes the metadata and marker.
    ``settings`` (the ``train:`` section) are kept so that a resume can say which of them changed;
    ``step_state`` is ``TrainStep.state_dict()``. Returns what ``write`` returns (the folder, below).

    A non-finite ``val_loss`` is refused (ValueError): that state is not worth keeping. A write that
    fails for want of space raises CheckpointWriteError after rank 0 removed the partial folder.

    ``write`` is called as ``save_checkpoint`` is: that function, or ``async_save_checkpoint`` with its
    ``group`` (the ``save_group``), which returns once the state is staged in CPU memory with a future
    that ends when the write has (on rank 0, when the folder is complete:
    brickwork/parallel/checkpoint/async_save.py). That future's errors are the write's as they are:
    :func:`write_failed` makes them what a synchronous save raises.
    """
    if not math.isfinite(val_loss):
        raise ValueError(f"refusing to save step {step} as a checkpoint: its validation loss is {val_loss}")
    folder = checkpoint_dir(run_dir, step)
    if _rank() == 0 and (folder.exists() or folder.is_symlink()):
        remove_path(folder)
    # No other rank touches the folder before the save's first barrier, which follows this.
    extra = {"trainer_format": TRAINER_FORMAT, "data": _encode(data_state), "val_loss": val_loss}
    if settings is not None:
        extra["train"] = dict(settings)
    if step_state is not None:
        extra["train_step"] = dict(step_state)
    try:
        return write(folder, model, optimizer, step, extra=extra)
    except (OSError, RuntimeError, CheckpointException) as err:
        raise write_failed(err, step, folder) from None


def write_failed(err: OSError | RuntimeError | CheckpointException, step: int, folder: Path) -> BaseException:
    """What a failed write of the checkpoint of ``step`` into ``folder`` raises: a Ctrl-C as it was, else
    after rank 0 removed the partial folder, a lost peer's error as gloo or NCCL raised it (which
    peers.py reports as such) or CheckpointWriteError."""
    if _interrupted(err):
        return err
    if _rank() == 0:
        remove_path(folder)
    lost = [cause for cause in _causes(err) if is_peer_failure(cause)]
    if lost:
        return lost[0]
    return CheckpointWriteError(
        f"could not write the checkpoint of step {step} to {folder} ({_write_failure(err)}); the "
        "partial folder was removed and the earlier checkpoints are intact; free some space (or "
        "lower train.keep_checkpoints) and continue with --resume"
    )


def load_run_checkpoint(
    folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, step: TrainStep | None = None
) -> LoadedCheckpoint:
    """Load a checkpoint into the model and optimizer as they are laid out now (any layout may have
    saved it), and ``step`` (its loss scaler), and restore this rank's RNG. ``folder`` is one
    ``latest_checkpoint(..., intact=True)`` returned, so its files were checked against the manifest
    there."""
    check_step_folder(folder)
    meta = load_checkpoint(folder, model, optimizer, verify=False)
    extra = meta.get("extra") or {}
    if extra.get("trainer_format") != TRAINER_FORMAT:
        raise ConfigError(
            f"{str(folder)!r} was not saved by brickwork train (format {TRAINER_FORMAT}); "
            "start a new run from its weights instead",
            "--resume",
        )
    try:
        data, val_loss = _decode(extra["data"]), float(extra["val_loss"])
        step_state = extra.get("train_step", {})
        if not isinstance(step_state, dict):
            raise TypeError(f"train_step is {step_state!r}, not a JSON object")
        if step is not None:
            step.load_state_dict(step_state)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise CorruptCheckpointError(
            f"{folder / META_FILE} is damaged: its trainer state cannot be read ({type(err).__name__}: {err})"
        ) from None
    return LoadedCheckpoint(meta, data, val_loss)


def export_run(source: Path, out: Path) -> Path:
    """Write the weights of ``source`` (a run folder's newest complete checkpoint, or one checkpoint
    folder) to the single-process safetensors file ``out``; returns the checkpoint folder used."""
    verify = is_complete(source)  # the newest one of a run is checked as it is chosen
    if verify:
        folder = source
        check_step_folder(folder, "RUN_DIR")
    elif folder_step(source) is not None or (source / META_FILE).exists():
        raise ConfigError(
            f"{str(source)!r} is a checkpoint whose save did not finish (no .complete marker); export "
            "the run folder instead, which uses its newest complete checkpoint",
            "RUN_DIR",
        )
    else:
        folder = latest_checkpoint(source, "RUN_DIR", intact=True)[1]
    export(folder, out, verify=verify)
    return folder


def _encode(state: dict[str, torch.Tensor]) -> dict[str, str]:
    """Byte tensors (a generator's state) as base64 text: ``extra`` is JSON."""
    return {k: base64.b64encode(v.cpu().numpy().tobytes()).decode("ascii") for k, v in state.items()}


def _decode(state: dict[str, str]) -> dict[str, torch.Tensor]:
    return {k: torch.frombuffer(bytearray(base64.b64decode(v)), dtype=torch.uint8) for k, v in state.items()}


def _causes(err: BaseException) -> list[BaseException]:
    """The errors inside DCP's CheckpointException (one per failed rank), or ``err`` itself."""
    if isinstance(err, CheckpointException):
        return [f[0] if isinstance(f, tuple) else f for f in err.failures.values()] or [err]
    return [err]


def _interrupted(err: BaseException) -> bool:
    return any(isinstance(c, KeyboardInterrupt) for c in _causes(err))


def _write_failure(err: BaseException) -> str:
    """Why a write failed, in a few words. torch's zip writer reports a short write (a full disk, a
    file size limit) as a RuntimeError about the stream position, which is said plainly here."""
    cause = _causes(err)[0]
    if isinstance(cause, OSError) and cause.errno:
        return os.strerror(cause.errno)
    text = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    if "unexpected pos" in text or "failed writing" in text:
        return f"a short write: the disk is full or a file size limit was reached ({text})"
    return f"{type(cause).__name__}: {text}"


def remove_path(path: Path) -> None:
    """Delete ``path``: a symbolic link itself, never what it points to."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0
