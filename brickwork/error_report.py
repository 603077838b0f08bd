"""How ``brickwork`` reports the error it ends on: which process says it, and in what one line.

Under torchrun every rank meets the same mistake, and rank 0 says it once. A run failure (a lost
peer) differs by rank, and rank 0 may be the one that is gone, so each rank says its own. A process
whose environment describes no world with a rank 0 beside it (a ``RANK`` left set without torchrun,
with no ``WORLD_SIZE`` above it, or one that is not a number) is alone, so it speaks for itself.

An OSError the system raised (a folder under a file, a read-only disk, a full one) is said as the
path it names and the system's reason, without Python's ``[Errno N]`` form.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from brickwork import launch_env
from brickwork.errors import RunFailure


def speaks(err: BaseException) -> bool:
    """Whether this process prints ``err``, the error the command ends on."""
    if isinstance(err, RunFailure):
        return True
    try:
        rank = launch_env.rank()
        return rank == 0 or rank >= launch_env.world_size()
    except RunFailure:  # a RANK or WORLD_SIZE that is not a number describes no world
        return True


def error_line(err: BaseException) -> str:
    """``err`` as the one line the command prints after ``error:``."""
    if not isinstance(err, OSError) or not err.strerror:
        return str(err)
    if err.filename is None:
        return err.strerror
    path = os.fsdecode(err.filename)
    where = f"{path!r} -> {os.fsdecode(err.filename2)!r}" if err.filename2 is not None else repr(path)
    return f"{where}: {err.strerror}{_blocking_file(path) if err.errno == errno.ENOTDIR else ''}"


def _blocking_file(path: str) -> str:
    """For a path that cannot be made because part of it is a file: which part."""
    for parent in Path(path).parents:
        if parent.exists() and not parent.is_dir():
            return f" ({str(parent)!r} is a file, not a folder)"
    return ""
