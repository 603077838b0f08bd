"""A peer that stops, or never comes, ends every other rank of a run with one clear error.

The process group starts with the dist dict's ``timeout_s`` (``brickwork.parallel.start_process_group``),
so no rank waits longer than that for a peer. What the rank then sees depends on the backend: gloo
raises a RuntimeError ("Connection closed by peer", "Timed out waiting ... for recv"), the store a
``DistStoreError`` ("... waiting for clients. 1/2 clients joined"). :func:`peers_watched` turns those
into :class:`PeerLostError`, which the ``brickwork`` command reports in one line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch.distributed as dist

from brickwork import launch_env
from brickwork.checkpoint import complete_checkpoints
from brickwork.errors import RunFailure

# What gloo's and NCCL's errors about a lost peer say; torch raises them as plain RuntimeErrors.
_PEER_MARKERS = (
    "gloo/transport",
    "Connection closed by peer",
    "Connection reset by peer",
    "Timed out waiting",
    "waiting for clients",
    "NCCL communicator was aborted",
    "Watchdog caught collective operation timeout",
)


class PeerLostError(RunFailure):
    """Another process of the run stopped, or did not answer within ``dist.timeout_s``."""


def is_peer_failure(error: BaseException) -> bool:
    """Whether ``error`` is a collective or the process group's start failing for want of a peer."""
    if isinstance(error, dist.DistError):
        return True
    return isinstance(error, RuntimeError) and any(m in str(error) for m in _PEER_MARKERS)


@contextlib.contextmanager
def peers_watched(timeout_s: float, run_dir: Path | None = None) -> Iterator[None]:
    """Raise a lost peer's error inside the block as PeerLostError naming ``dist.timeout_s`` and, when
    ``run_dir`` holds a complete checkpoint, how to continue."""
    try:
        yield
    except RuntimeError as err:
        if not is_peer_failure(err) or isinstance(err, RunFailure):
            raise
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        cause = lines[0] if lines else type(err).__name__
        saved = run_dir is not None and complete_checkpoints(run_dir)
        then = f"; continue from the newest complete checkpoint with --resume {run_dir}" if saved else ""
        raise PeerLostError(
            f"rank {launch_env.rank()}: another process of the run stopped or did not answer within "
            f"dist.timeout_s={timeout_s:g} s ({cause[:240]}); this one stopped too{then}"
        ) from None
