"""How many CPU threads one training process computes with.

torch starts with one intra-op thread per physical core of the machine, whatever share of it the
process may use. Pinned to fewer cores (``taskset``, a container's cpuset), or one of several
processes on a node (``torchrun --nproc_per_node``), a process would then run more busy threads than
it has cores, and on CPU every op waits for the slowest of them. ``brickwork train`` runs with the
count :func:`cpu_threads` gives: the usable cores shared out among this node's processes. It only
ever lowers torch's count, so a lower one the program set itself, or an ``OMP_NUM_THREADS`` the user
set (torch reads it at start), is kept.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import NamedTuple

import torch

from brickwork.launch_env import local_world_size

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


class CPUThreads(NamedTuple):
    """``threads``: the intra-op thread count; ``reason``: where it comes from, in words."""

    threads: int
    reason: str


def usable_cores() -> tuple[int, str]:
    """(cores this process may run on, what limits them): its CPU affinity, and a cgroup v2 quota."""
    try:
        cores, limit = len(os.sched_getaffinity(0)), "CPU affinity"
    except AttributeError:  # no sched_getaffinity (macOS, Windows)
        cores, limit = os.cpu_count() or 1, "CPUs"
    quota = _cgroup_quota()
    if quota is not None and quota < cores:
        return quota, "cgroup CPU quota"
    return cores, limit


def cpu_threads() -> CPUThreads:
    """The intra-op thread count ``brickwork train`` uses on CPU, and why (e.g. for ``brickwork info``).

    ``OMP_NUM_THREADS`` when set; otherwise the usable cores divided among the ``LOCAL_WORLD_SIZE``
    processes torchrun started on this node (1 for a plain process), at least 1 and at most torch's
    current count (by default one per physical core).
    """
    if os.environ.get("OMP_NUM_THREADS"):
        return CPUThreads(torch.get_num_threads(), f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
    cores, limit = usable_cores()
    processes = max(1, local_world_size())
    share = max(1, cores // processes)
    current = torch.get_num_threads()
    threads = min(share, current)
    where = f"{cores} usable cores ({limit})"
    if processes > 1:
        where += f" shared by {processes} processes on this node"
    if threads < share:
        where += f"; torch's count of {current} is lower"
    return CPUThreads(threads, where)


def apply_cpu_threads() -> CPUThreads:
    """Lower torch's intra-op thread count to :func:`cpu_threads` where it is higher; return it."""
    choice = cpu_threads()
    if torch.get_num_threads() > choice.threads:
        torch.set_num_threads(choice.threads)
    return choice


def _cgroup_quota() -> int | None:
    """The cgroup v2 CPU quota in whole cores (rounded up), or None when there is none."""
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, math.ceil(int(quota) / int(period)))
