"""The process launcher: results come back by rank; a hang or a failing rank ends the test, never stalls."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from brickwork.parallel import SpawnError, spawn

pytestmark = [pytest.mark.distributed]


def _sum_of_ranks() -> dict:
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "sum": t}


def _rank0_never_returns() -> None:
    if dist.get_rank() == 0:
        time.sleep(3600)


def _rank1_raises_while_rank0_waits() -> None:
    if dist.get_rank() == 1:
        raise ValueError("rank one failed on purpose")
    dist.barrier()


@pytest.mark.timeout(120)
def test_results_come_back_by_rank() -> None:
    results = spawn(_sum_of_ranks, 2, timeout=60)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(torch.equal(r["sum"], torch.tensor([1.0])) for r in results)


@pytest.mark.timeout(120)
def test_a_hang_is_killed_and_reported() -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"ranks \[0\] of 2 did not finish"):
        # Long enough for rank 1 to start and finish even on a loaded machine.
        spawn(_rank0_never_returns, 2, timeout=40)
    assert time.monotonic() - start < 100


@pytest.mark.timeout(120)
def test_a_failing_rank_is_reported_while_the_others_are_stuck() -> None:
    with pytest.raises(SpawnError, match="rank 1 raised ValueError: rank one failed on purpose") as error:
        spawn(_rank1_raises_while_rank0_waits, 2, timeout=60, error_grace=5)
    # The root cause comes first; rank 0 may add its own error from the broken collective.
    assert error.value.errors[0].rank == 1
