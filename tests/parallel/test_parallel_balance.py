"""Stage balancing on synthetic cost tables (against brute force), heterogeneous speeds, the layer
cost estimate, uneven data-parallel rows, and the dist-dict checks; no processes needed."""

from __future__ import annotations

import itertools
import random

import pytest
from parallel_cases import build

from brickwork.errors import ConfigError
from brickwork.parallel import ParallelConfig, split_rows, split_stages
from brickwork.parallel.balance import module_cost
from brickwork.parallel.pipeline.stages import stage_layer_counts


def slowest(costs, counts, weights, first_extra=0.0, last_extra=0.0) -> float:
    """Time of the slowest stage of a split (the quantity the balancer minimizes)."""
    times, start = [], 0
    for s, n in enumerate(counts):
        extra = (first_extra if s == 0 else 0.0) + (last_extra if s == len(counts) - 1 else 0.0)
        times.append((sum(costs[start : start + n]) + extra) / weights[s])
        start += n
    return max(times)


def brute_force(costs, stages, weights, first_extra=0.0, last_extra=0.0) -> float:
    n = len(costs)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = (0, *cuts, n)
        counts = [bounds[i + 1] - bounds[i] for i in range(stages)]
        best = min(best, slowest(costs, counts, weights, first_extra, last_extra))
    return best


def test_random_cost_tables_get_the_optimal_split() -> None:
    rng = random.Random(0)
    for _ in range(200):
        n, stages = rng.randint(2, 9), rng.randint(1, 4)
        if stages > n:
            continue
        costs = [rng.uniform(0.1, 10.0) for _ in range(n)]
        weights = [rng.choice([1.0, 2.0, 0.5]) for _ in range(stages)]
        first, last = rng.choice([0.0, 3.0]), rng.choice([0.0, 5.0])
        counts = split_stages(costs, stages, weights, first_extra=first, last_extra=last)
        assert sum(counts) == n and len(counts) == stages and min(counts) >= 1
        got = slowest(costs, counts, weights, first, last)
        assert got == pytest.approx(brute_force(costs, stages, weights, first, last), rel=1e-12)


def test_a_stage_twice_as_fast_gets_about_twice_the_cost() -> None:
    costs = [1.0] * 12
    counts = split_stages(costs, 2, [2.0, 1.0])
    assert counts == (8, 4)
    uneven = [1.0, 3.0, 1.0, 2.0, 1.0, 1.0, 2.0, 1.0, 3.0, 1.0]  # 16 in all
    counts = split_stages(uneven, 2, [2.0, 1.0])
    first = sum(uneven[: counts[0]])
    assert 2.0 * 0.8 <= first / (16 - first) <= 2.0 * 1.25


def test_costly_layers_and_the_head_shift_the_split() -> None:
    assert split_stages([1.0, 1.0, 1.0, 1.0], 2) == (2, 2)
    assert split_stages([1.0, 1.0, 1.0, 1.0], 2, last_extra=2.0) == (3, 1)
    assert split_stages([4.0, 1.0, 1.0, 1.0, 1.0], 2) == (1, 4)  # one heavy layer (an MoE) alone


def test_impossible_splits_raise() -> None:
    with pytest.raises(ConfigError, match="3 layers cannot fill 4 pipeline stages"):
        split_stages([1.0] * 3, 4)
    with pytest.raises(ConfigError, match="device_weights"):
        split_stages([1.0] * 3, 2, [1.0, 0.0])


def test_layer_cost_is_parameters_plus_attention_scores() -> None:
    model = build("gpt")  # max_seq_len 16, 4 heads of 8, causal
    layer = model.layers[0]
    params = sum(p.numel() for p in layer.parameters())
    # Per query, QKᵀ and softmax·V are 16 × 4 × 8 multiply-adds each: 4 FLOPs a product forward, 12
    # with backward; half of them under the causal mask.
    assert module_cost(layer, 16) == 6 * params + 12 * 16 * 4 * 8 * 0.5
    assert module_cost(layer, 32) - module_cost(layer, 16) == 12 * 16 * 4 * 8 * 0.5


def test_stage_layer_counts_from_the_dist_dict() -> None:
    model = build("gpt4")
    pp2 = {"pipeline_parallel_size": 2}
    assert stage_layer_counts(model, ParallelConfig.from_dict(pp2)) == (2, 2)
    assert stage_layer_counts(model, ParallelConfig.from_dict({**pp2, "device_weights": [3, 1]})) == (3, 1)
    assert stage_layer_counts(model, ParallelConfig.from_dict({**pp2, "pipeline_layers": [1, 3]})) == (1, 3)
    libai = {**pp2, "pipeline_num_layers": 4, "custom_pipeline_stage_id": [0, 1, 1, 1]}
    assert stage_layer_counts(model, ParallelConfig.from_dict(libai)) == (1, 3)
    interleaved = {**pp2, "pipeline_schedule": "interleaved_1f1b", "virtual_pipeline_size": 2}
    assert stage_layer_counts(model, ParallelConfig.from_dict(interleaved)) == (1, 1, 1, 1)


def test_uneven_rows_follow_the_weights() -> None:
    assert split_rows(4, None, 2) == (2, 2)
    assert split_rows(4, [3, 1], 2) == (3, 1)
    assert split_rows(8, [2, 1, 1], 3) == (4, 2, 2)
    assert split_rows(3, [100, 1], 2) == (2, 1)  # every rank keeps a row
    assert split_rows(10, [1, 1, 1], 3) in {(4, 3, 3), (3, 4, 3), (3, 3, 4)}
    with pytest.raises(ValueError, match="batch size 5 is not divisible by data_parallel_size=2"):
        split_rows(5, None, 2)
    with pytest.raises(ValueError, match="batch size 1 is smaller than data_parallel_size=2"):
        split_rows(1, [1, 1], 2)


@pytest.mark.parametrize(
    ("dist", "words"),
    [
        (
            {"pipeline_parallel_size": 2, "data_parallel_size": 2, "device_weights": [1, 2]},
            ["one dim at a time"],
        ),
        (
            {"pipeline_parallel_size": 2, "device_weights": [1, 2, 3]},
            ["3 entries", "pipeline_parallel_size=2"],
        ),
        ({"data_parallel_size": 2, "device_weights": [1, -2]}, ["positive numbers"]),
        ({"pipeline_parallel_size": 2, "pipeline_layers": [1, 0]}, ["pipeline_layers", ">= 1"]),
        ({"pipeline_parallel_size": 2, "pipeline_layers": [1, 1, 1]}, ["3 entries", "2 stages"]),
        (
            {"pipeline_parallel_size": 4, "pipeline_schedule": "interleaved_1f1b", "num_microbatches": 6},
            ["num_microbatches=6 is not a multiple of pipeline_parallel_size=4"],
        ),
    ],
)
def test_bad_pipeline_options_raise_config_error(dist: dict, words: list[str]) -> None:
    with pytest.raises(ConfigError) as error:
        ParallelConfig.from_dict(dist)
    for word in words:
        assert word in str(error.value)
