"""Expert parallel trains a 4-expert MoE decoder like one process: ep=2 (alone, with ZeRO-1, with
ZeRO-3, with clipping, with expert 3 starved at top-2, with both of rank 1's experts starved at
top-1) on 2 ranks, and dp2×ep2 (ZeRO-0 with accumulation and activation checkpointing, ZeRO-1 with
clipping, ZeRO-3 with accumulation) and ep2 with tp2 on 4. A checkpoint saved at ep=2 under ZeRO-1
(weights and optimizer) reloads at ep=2 (ZeRO-1 and 0), at ep=1 and in one process, exports to one
safetensors file, and training resumed from it takes the steps the uninterrupted run takes.
evaluate gives the single-process loss; meta init is refused.

The reference is the plain loop of expert_parallel_cases: the load-balancing loss is that of each
data-parallel rank's rows, as under data parallel without experts split, so ep changes nothing.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from expert_parallel_cases import EXPERTS, ROWS, SEQ, STEPS, build, logits, reference, run_world
from safetensors.torch import load_file

from brickwork.errors import ConfigError
from brickwork.parallel import ParallelConfig, export, load_checkpoint, spawn
from brickwork.parallel.expert_parallel import check_expert_parallel

pytestmark = [pytest.mark.distributed]

EP2 = {"data_parallel_size": 2, "expert_parallel_size": 2}
CASES_2 = {
    "ep2": EP2,
    "ep2-zero3-clip": {**EP2, "zero_stage": 3, "grad_clip": 0.05},
    "ep2-clip": {**EP2, "grad_clip": 0.05},
    "ep2-starved": {**EP2, "top_k": 1, "starve": "upper-half"},
    "ep2-starved-top2": {**EP2, "starve": "last"},
    "ep2-zero1": {**EP2, "zero_stage": 1},
}
BF16_MIXED = {"zero_stage": 3, "mixed_precision": "bf16", "precision": "bf16-mixed"}
BF16 = {"ep2-zero3-bf16-mixed": {**EP2, **BF16_MIXED}}
DP4_EP2 = {"data_parallel_size": 4, "expert_parallel_size": 2}
CASES_4 = {
    # The experts' own DDP (over the 2 ranks holding them) under accumulation and recomputation.
    "dp2xep2-accum2-full-ac": {**DP4_EP2, "grad_accum_steps": 2, "activation_checkpointing": "full"},
    "dp2xep2-zero3-accum2": {**DP4_EP2, "zero_stage": 3, "grad_accum_steps": 2},
    "dp2xep2-zero1-clip": {**DP4_EP2, "zero_stage": 1, "grad_clip": 0.05},
    "ep2-tp2": {**EP2, "tensor_parallel_size": 2},
}


@functools.cache
def world(size: int, directory: str | None = None) -> list[dict]:
    cases = {**CASES_2, **BF16} if size == 2 else CASES_4
    return spawn(run_world, size, list(cases.items()), directory, timeout=300)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], Path]:
    folder = tmp_path_factory.mktemp("ep2-checkpoint")
    return world(2, str(folder)), folder


def check(per_rank: list[dict], key: str, layout: dict) -> None:
    # The load-balancing loss is each micro-batch's: one per data-parallel rank and accumulation step.
    parts = layout["data_parallel_size"] * layout.get("grad_accum_steps", 1)
    ref = reference(layout.get("top_k", 2), layout.get("starve"), parts, layout.get("grad_clip"))
    got = per_rank[0][key]
    for other in per_rank[1:]:
        assert other[key]["losses"] == got["losses"], "ranks returned different losses"
    for step, (loss, want) in enumerate(zip(got["losses"], ref["losses"], strict=True)):
        assert abs(loss - want) <= 1e-5 * abs(want), f"step {step}: loss {loss} vs one process {want}"
    assert abs(got["eval"] - ref["eval"]) <= 1e-5 * ref["eval"], f"evaluate {got['eval']} vs {ref['eval']}"
    assert list(got["state"]) == list(ref["state"]), "full_state_dict keys or their order differ"
    for name, want in ref["state"].items():
        torch.testing.assert_close(got["state"][name], want, rtol=0, atol=1e-5, msg=f"{name}, step {STEPS}")
        assert torch.equal(per_rank[-1][key]["state"][name], got["state"][name]), f"{name}: ranks differ"
    # Each rank holds its half of the experts: ep rank i (dp rank i mod 2) experts 2i and 2i + 1.
    tp = layout.get("tensor_parallel_size", 1)
    for rank, rank_result in enumerate(per_rank):
        ep_rank = (rank // tp) % 2
        assert rank_result[key]["held_experts"] == [2 * ep_rank, 2 * ep_rank + 1]


@pytest.mark.timeout(420)
@pytest.mark.parametrize("key", list(CASES_2))
def test_ep2_trains_like_one_process(two_ranks: tuple[list[dict], Path], key: str) -> None:
    check(two_ranks[0], key, CASES_2[key])


@pytest.mark.timeout(420)
def test_bf16_mixed_under_zero3_stays_close(two_ranks: tuple[list[dict], Path]) -> None:
    # bf16 compute (FSDP's MixedPrecisionPolicy, the experts' units too) against the fp32 loop.
    want = reference(2, None, 2)["losses"]
    for loss, ref in zip(two_ranks[0][0]["ep2-zero3-bf16-mixed"]["losses"], want, strict=True):
        assert abs(loss - ref) <= 2e-2 * ref


@pytest.mark.timeout(420)
def test_starved_experts_get_no_token_and_the_counts_are_the_global_batch(
    two_ranks: tuple[list[dict], Path],
) -> None:
    per_rank = two_ranks[0]
    first_step = per_rank[0]["ep2-starved"]["expert_counts"][0]
    assert len(first_step) == 2  # one count vector per MoE layer, summed over dp
    for layer in first_step:
        assert layer[2:] == [0, 0], first_step  # rank 1's experts received nothing
        assert sum(layer) == ROWS * SEQ  # top-1: one assignment per token of the global batch
    for step in per_rank[0]["ep2-starved-top2"]["expert_counts"]:  # every step, not only the first
        for layer in step:
            assert layer[3] == 0 and min(layer[:3]) > 0, step
            assert sum(layer) == 2 * ROWS * SEQ  # top-2


@pytest.mark.timeout(420)
def test_checkpoint_saved_at_ep2_zero1_reloads_at_ep2_ep1_and_in_one_process(
    two_ranks: tuple[list[dict], Path],
) -> None:
    per_rank, folder = two_ranks
    saved = per_rank[0]["checkpoint"]["saved"]
    next_loss = per_rank[0]["checkpoint"]["next_loss"]
    for rank_result in per_rank:
        for layout in ("ep2-zero1", "ep2", "ep1"):
            torch.testing.assert_close(rank_result["checkpoint"][layout], saved, rtol=0, atol=1e-6)
            resumed = rank_result["checkpoint"][f"{layout}_next_loss"]
            for got, want in zip(resumed, next_loss, strict=True):
                assert abs(got - want) <= 1e-5 * want, f"{layout}: {resumed} vs {next_loss}"
    plain = build()
    load_checkpoint(folder, plain)
    torch.testing.assert_close(logits(plain), saved, rtol=0, atol=1e-6)
    exported = build()
    exported.load_state_dict(load_file(export(folder, folder.parent / "ep2.safetensors")))
    torch.testing.assert_close(logits(exported), saved, rtol=0, atol=1e-6)


@pytest.mark.timeout(420)
def test_meta_init_is_refused_on_every_rank(two_ranks: tuple[list[dict], Path]) -> None:
    for rank_result in two_ranks[0]:
        assert "expert_parallel_size" in rank_result["meta_init"]
        assert "needs the real model on every rank" in rank_result["meta_init"]


@pytest.mark.slow
@pytest.mark.timeout(480)
@pytest.mark.parametrize("key", list(CASES_4))
def test_four_ranks_train_like_one_process(key: str) -> None:
    check(world(4), key, CASES_4[key])


@pytest.mark.parametrize(
    ("dist", "words"),
    [
        ({"data_parallel_size": 2, "expert_parallel_size": 4}, "must divide data_parallel_size=2"),
        ({"data_parallel_size": 3, "expert_parallel_size": 2}, "must divide data_parallel_size=3"),
        ({"expert_parallel_size": 0}, "must be a positive integer"),
        (
            {"data_parallel_size": 2, "expert_parallel_size": 2, "pipeline_parallel_size": 2},
            "not supported under a pipeline",
        ),
        (
            {"data_parallel_size": 2, "expert_parallel_size": 2, "context_parallel_size": 2},
            "not supported with context_parallel_size > 1",
        ),
    ],
)
def test_bad_expert_parallel_sizes_are_config_errors(dist: dict, words: str) -> None:
    with pytest.raises(ConfigError, match="expert_parallel_size") as error:
        ParallelConfig.from_dict(dist)
    assert words in str(error.value)


@pytest.mark.parametrize(
    ("model", "dist", "words"),
    [
        ("dense", EP2, "has no mixture-of-experts layer"),
        ("moe", {"data_parallel_size": 8, "expert_parallel_size": 8}, f"has {EXPERTS} experts, which"),
    ],
)
def test_models_expert_parallel_cannot_split_are_config_errors(model: str, dist: dict, words: str) -> None:
    built = build()
    if model == "dense":
        from parallel_cases import build as build_dense

        built = build_dense("gpt")
    with pytest.raises(ConfigError, match="expert_parallel_size") as error:
        check_expert_parallel(built, ParallelConfig.from_dict(dist))
    assert words in str(error.value)
