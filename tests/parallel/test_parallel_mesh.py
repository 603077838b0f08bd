"""Rank grouping equals LiBai's documented examples, and bad dist dicts fail on every rank."""

from __future__ import annotations

import pytest
from parallel_cases import bad_layout_uncaught, bad_layouts, mesh_groups

from brickwork.parallel import RankError, spawn

pytestmark = [pytest.mark.distributed]

DP2_TP4 = {"data_parallel_size": 2, "tensor_parallel_size": 4}
PP2_DP2_TP2 = {"pipeline_parallel_size": 2, "data_parallel_size": 2, "tensor_parallel_size": 2}


def groups_along(per_rank: list[list[dict]], layout: int, dim: str) -> list[list[int]]:
    return sorted({tuple(r[layout][dim]) for r in per_rank})


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_eight_ranks_group_as_in_libai() -> None:
    per_rank = spawn(mesh_groups, 8, [DP2_TP4, PP2_DP2_TP2], timeout=240)
    # dp=2, tp=4: TP groups [0..3] and [4..7]; DP pairs across them.
    assert groups_along(per_rank, 0, "tp") == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert groups_along(per_rank, 0, "dp") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert groups_along(per_rank, 0, "pp") == [(r,) for r in range(8)]
    # pp=dp=tp=2: stage 0 is ranks 0-3; TP pairs [0,1],[2,3]; DP pairs [0,2],[1,3].
    assert groups_along(per_rank, 1, "tp") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert groups_along(per_rank, 1, "dp") == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert groups_along(per_rank, 1, "pp") == [(0, 4), (1, 5), (2, 6), (3, 7)]


BAD = [
    ("llama", {"data_parallel_size": 3}),
    ("llama", {"data_parallel_size": 2, "tensor_parallel_size": 2}),
    ("odd-heads", {"tensor_parallel_size": 2}),
    ("llama", {"tensor_parallel_size": 2, "zero_stage": 4}),
    ("llama", {"tensor_paralel_size": 2}),
]
EXPECTED = [
    "= 3, but the world size is 2",
    "= 4, but the world size is 2",
    "num_kv_heads=3 is not divisible by tensor_parallel_size=2",
    "zero_stage: unknown value 4",
    "did you mean 'tensor_parallel_size'",
]


@pytest.mark.timeout(240)
def test_bad_dist_dicts_raise_on_every_rank_without_hanging() -> None:
    per_rank = spawn(bad_layouts, 2, BAD, timeout=120)
    for messages in per_rank:
        for message, expected in zip(messages, EXPECTED):
            assert expected in message
    # Uncaught, every rank ends with the error; none waits in a collective for the others.
    outcomes = spawn(
        bad_layout_uncaught, 2, "odd-heads", {"tensor_parallel_size": 2}, timeout=120, raise_errors=False
    )
    assert all(isinstance(o, RankError) and o.type_name == "ConfigError" for o in outcomes)
    assert all("num_kv_heads=3" in o.message for o in outcomes)
