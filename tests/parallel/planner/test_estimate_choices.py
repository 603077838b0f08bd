"""``estimate`` fills what a dist dict leaves open with the best choice that fits, and says what it
chose; a dist dict that fixes the choices is priced as given."""

from __future__ import annotations

import itertools

from planner_cases import gpt_spec

from brickwork.errors import ConfigError
from brickwork.parallel import estimate
from brickwork.parallel.planner.model_facts import model_facts

CLUSTER = "2x8xH100-80GB"
SIZES = {
    "tensor_parallel_size": 2,
    "pipeline_parallel_size": 4,
    "data_parallel_size": 2,
    "sequence_parallel": True,
}


def spec() -> dict:
    s = {**gpt_spec(layers=16), "dim_model": 2048, "max_seq_len": 2048, "vocab_size": 32000}
    s["decoder"]["block"]["attention"]["num_heads"] = 16
    s["decoder"]["block"]["feedforward"]["hidden_dim"] = 8192
    return s


def test_estimate_chooses_the_fastest_candidate_that_fits_and_says_so() -> None:
    facts = model_facts(spec())
    options = {"global_batch": 64, "seq_len": 2048}
    filled = estimate(facts, CLUSTER, SIZES, **options)
    assert set(filled.chosen) == {
        "micro_batch_size",
        "num_microbatches",
        "pipeline_schedule",
        "virtual_pipeline_size",
        "activation_checkpointing",
    }
    assert filled.fits
    # Every candidate, fixed in the dist dict: none that fits is faster.
    candidates = []
    schedules = [("1f1b", 1), ("gpipe", 1), ("interleaved_1f1b", 2), ("interleaved_1f1b", 4)]
    for micro_batch, (schedule, v), recompute in itertools.product(
        (1, 2, 4, 8, 16, 32), schedules, ("none", "selective", "full")
    ):
        dist = {**SIZES, "num_microbatches": 32 // micro_batch, "pipeline_schedule": schedule,
                "virtual_pipeline_size": v, "activation_checkpointing": recompute}  # fmt: skip
        try:
            fixed = estimate(facts, CLUSTER, dist, **options)
        except ConfigError:  # fewer micro-batches than 1F1B's stages
            continue
        assert fixed.chosen == {}  # nothing left open
        candidates.append(fixed)
    assert len(candidates) == 4 * 4 * 3 + 2 * 3  # every schedule from 4 micro-batches on, GPipe below
    fastest = min((p for p in candidates if p.fits), key=lambda p: p.step_time_s)
    assert filled.step_time_s == fastest.step_time_s and filled.dist == fastest.dist
    assert filled.chosen["micro_batch_size"] == fastest.micro_batch_size


def test_a_fixed_dist_is_priced_as_given() -> None:
    dist = {**SIZES, "num_microbatches": 8, "pipeline_schedule": "gpipe", "activation_checkpointing": "full"}
    p = estimate(spec(), CLUSTER, dist, global_batch=64, seq_len=2048)
    assert p.chosen == {} and p.micro_batch_size == 4
    assert (p.dist["num_microbatches"], p.dist["pipeline_schedule"], p.dist["activation_checkpointing"]) == (
        8,
        "gpipe",
        "full",
    )


def test_without_a_pipeline_the_accumulation_is_a_choice_unless_given() -> None:
    dist = {"data_parallel_size": 16, "activation_checkpointing": "none"}
    open_ = estimate(spec(), CLUSTER, dist, global_batch=256, seq_len=2048)
    assert set(open_.chosen) == {"micro_batch_size", "grad_accum_steps"}
    assert open_.micro_batch_size * open_.grad_accum_steps == 16
    given = estimate(spec(), CLUSTER, dist, global_batch=256, seq_len=2048, grad_accum_steps=8)
    assert given.chosen == {} and (given.micro_batch_size, given.grad_accum_steps) == (2, 8)


def test_when_nothing_fits_the_least_memory_is_kept() -> None:
    tiny = [{"preset": "H100-80GB", "memory_gib": 4, "count": 16, "node": 0}]
    p = estimate(spec(), tiny, SIZES, global_batch=64, seq_len=2048)
    assert not p.fits
    assert p.chosen["micro_batch_size"] == 1 and p.chosen["activation_checkpointing"] == "full"
