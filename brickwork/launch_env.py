"""This process's place in its run: its rank, its index on its node, the world size, the processes on
its node, and whether it is the first rank. Every part of brickwork asks here, so every part answers
by the same rule.

A process is launched when its environment holds ``RANK``: torchrun sets ``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` together. A process without ``RANK`` is a plain
``python`` process, a world of one at rank 0, whatever else its environment holds: a ``WORLD_SIZE``
alone was left in a shell, not set by a launcher. The opposite, a ``RANK`` without the rest, is
refused by :func:`check_launch_environment` before a process group starts.

Before the process group is up the answers come from that environment; once it is up, from
torch.distributed, so the two never disagree within a run.
"""

from __future__ import annotations

import os

import torch.distributed as dist

from brickwork.errors import RunFailure

# What torchrun sets for every process besides RANK; the process group's env:// start reads them all.
LAUNCH_VARIABLES = ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launched() -> bool:
    """Whether a launcher such as torchrun started this process (``RANK`` is in its environment)."""
    return "RANK" in os.environ


def rank() -> int:
    """This process's global rank: the process group's once it is up, else ``RANK``, else 0."""
    if _group_is_up():
        return dist.get_rank()
    return _number("RANK") if launched() else 0


def world_size() -> int:
    """The number of processes of this run: the process group's size once it is up, else the
    launcher's ``WORLD_SIZE`` (1 when it left it unset), else 1 for a plain ``python`` process."""
    if _group_is_up():
        return dist.get_world_size()
    if not launched() or "WORLD_SIZE" not in os.environ:
        return 1
    return _number("WORLD_SIZE")


def local_rank() -> int | None:
    """This process's index on its node, torchrun's ``LOCAL_RANK``; None when no launcher set it."""
    return _number("LOCAL_RANK") if "LOCAL_RANK" in os.environ else None


def local_world_size() -> int:
    """The number of this run's processes on this node: torchrun's ``LOCAL_WORLD_SIZE``, the world
    size when the launcher left it unset, and 1 for a plain ``python`` process."""
    if not launched():
        return 1
    return _number("LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in os.environ else world_size()


def is_first_rank() -> bool:
    """Whether this process is rank 0, the one that speaks for the run and takes its folder's lock."""
    return rank() == 0


def check_launch_environment() -> None:
    """RunFailure naming what is missing when ``RANK`` is set without the rest of a launcher's
    environment: a ``RANK`` left over in a shell, not a launched world, whose start would otherwise
    fail deep in torch's rendezvous."""
    missing = [name for name in LAUNCH_VARIABLES if name not in os.environ]
    if missing:
        unset = f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not"
        raise RunFailure(
            f"RANK={os.environ['RANK']} is set, but {unset}: this process was not started by torchrun "
            "(or a launcher that sets them together); unset RANK to run one process, or launch the run "
            "with torchrun"
        )


def _group_is_up() -> bool:
    # torch builds without distributed support have no process group to ask.
    return dist.is_available() and dist.is_initialized()


def _number(name: str) -> int:
    """The environment's ``name`` as a process number, or RunFailure saying it is not one."""
    value = os.environ[name]
    if not (value.isascii() and value.isdigit()):
        raise RunFailure(
            f"{name}={value!r} is not a process number (0, 1, 2, ...): torchrun sets it; unset RANK to run "
            "one process, or launch the run with torchrun"
        )
    return int(value)
