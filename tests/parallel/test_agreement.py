"""Ranks given different models or layouts all stop with the same error instead of hanging."""

from __future__ import annotations

import pytest
from agreement_cases import (
    parallelize_with_a_different_layout_on_rank1,
    parallelize_with_a_different_model_on_rank1,
    parallelize_with_a_layout_too_big_on_rank1,
)

from brickwork.parallel import spawn
from brickwork.parallel.launch import RankError

pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def _errors(results: list) -> list[RankError]:
    assert all(isinstance(r, RankError) for r in results), results
    assert len({r.message for r in results}) == 1  # every rank says the same
    return results


@pytest.mark.timeout(180)
def test_tp2_with_a_different_spec_on_rank1_is_an_error_on_every_rank() -> None:
    # 2 heads instead of 4: the same tensor shapes, read differently, and different TP shards.
    results = spawn(
        parallelize_with_a_different_model_on_rank1,
        2,
        "num_heads",
        2,
        {"tensor_parallel_size": 2},
        timeout=120,
        raise_errors=False,
    )
    for error in _errors(results):
        assert error.type_name == "ConfigError"
        assert "the ranks were not given the same model and layout" in error.message
        assert "the model spec of rank(s) [1] differ(s) from rank 0's" in error.message
        assert "parameter names and shapes" not in error.message


@pytest.mark.timeout(180)
def test_a_different_dist_dict_on_rank1_is_an_error_on_every_rank() -> None:
    results = spawn(parallelize_with_a_different_layout_on_rank1, 2, timeout=120, raise_errors=False)
    for error in _errors(results):
        assert "the dist dict of rank(s) [1] differ(s) from rank 0's" in error.message
        assert "model spec" not in error.message


@pytest.mark.timeout(180)
def test_a_dist_dict_not_fitting_the_world_on_rank1_stops_every_rank_at_once() -> None:
    # Rank 1 knows its dict wants 4 processes; rank 0, whose dict fits, must not wait for it until
    # timeout_s (600 s): the spawn timeout is far below that.
    results = spawn(parallelize_with_a_layout_too_big_on_rank1, 2, timeout=120, raise_errors=False)
    assert all(isinstance(r, RankError) for r in results), results
    assert "the dist dict of rank(s) [1] differ(s) from rank 0's" in results[0].message
    assert results[1].type_name == "WorldSizeError" and "the world size is 2" in results[1].message
