"""Pipeline parallel (alone, with DP, with TP, and the full 3D) trains like one process.

Each world size spawns one process group that runs all its layouts; every layout is checked against
the single-process run of the same spec, seed and data (losses within 1e-5 relative, the gathered
weights after 3 steps within 1e-5). Bad pipeline layouts raise on every rank, none hangs.
"""

from __future__ import annotations

import functools

import pytest
import torch
from parallel_cases import (
    bad_batches,
    bad_layout_uncaught,
    bad_layouts,
    check_against_reference,
    run_layouts,
    single_process,
    varying_batches,
    varying_batches_reference,
)

from brickwork.parallel import RankError, spawn

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

PP2 = {"pipeline_parallel_size": 2}
DP2 = {"data_parallel_size": 2}
TP2 = {"tensor_parallel_size": 2}
INTERLEAVED = {"pipeline_schedule": "interleaved_1f1b", "virtual_pipeline_size": 2}
CASES = {
    2: {
        "gpt/pp2-gpipe": ("gpt", {**PP2, "pipeline_schedule": "gpipe", "forward": True}),
        "llama/pp2-1f1b": ("llama", {**PP2, "pipeline_schedule": "1f1b"}),
        "gpt4/pp2-interleaved": ("gpt4", {**PP2, **INTERLEAVED, "forward": True}),
        "llama4/pp2-interleaved-m4": ("llama4", {**PP2, **INTERLEAVED, "num_microbatches": 4}),
        "gpt4/pp2-device-weights-3-1": ("gpt4", {**PP2, "device_weights": [3, 1]}),
        "llama4/pp2-pipeline-layers-1-3": ("llama4", {**PP2, "pipeline_layers": [1, 3]}),
        "gpt/pp2-bf16": ("gpt", {**PP2, "precision": "bf16"}),
        "gpt/pp2-gpipe-m4-clip-ac": (
            "gpt",
            {
                **PP2,
                "pipeline_schedule": "gpipe",
                "num_microbatches": 4,
                "grad_clip": 0.05,
                "activation_checkpointing": "full",
            },
        ),
    },
    4: {
        "gpt/pp2-dp2": ("gpt", {**PP2, **DP2}),
        "llama/pp2-dp2-zero1": ("llama", {**PP2, **DP2, "zero_stage": 1}),
        "llama/pp2-dp2-zero3-clip": ("llama", {**PP2, **DP2, "zero_stage": 3, "grad_clip": 0.05}),
        "llama/pp2-tp2": ("llama", {**PP2, **TP2, "forward": True}),
        "gpt/pp2-tp2-sp-gpipe": (
            "gpt",
            {**PP2, **TP2, "sequence_parallel": True, "pipeline_schedule": "gpipe"},
        ),
    },
    8: {
        "gpt/pp2-dp2-tp2": ("gpt", {**PP2, **DP2, **TP2, "sequence_parallel": True}),
        "llama4/pp2-dp2-tp2-interleaved-zero2": (
            "llama4",
            {**PP2, **DP2, **TP2, **INTERLEAVED, "zero_stage": 2},
        ),
    },
}
ALL = [
    (size, key) for size, cases in CASES.items() for key, (_, lay) in cases.items() if "precision" not in lay
]


@functools.cache
def results(world_size: int) -> list[dict]:
    cases = [(key, kind, layout) for key, (kind, layout) in CASES[world_size].items()]
    return spawn(run_layouts, world_size, cases, timeout=420)


@pytest.mark.timeout(480)
@pytest.mark.parametrize(("world_size", "key"), ALL)
def test_pipeline_layouts_match_one_process(world_size: int, key: str) -> None:
    kind, layout = CASES[world_size][key]
    check_against_reference(results(world_size), key, kind, layout.get("grad_clip"))


@pytest.mark.timeout(480)
@pytest.mark.parametrize(
    ("world_size", "key"), [(2, "gpt/pp2-gpipe"), (2, "gpt4/pp2-interleaved"), (4, "llama/pp2-tp2")]
)
def test_pipeline_forward_gives_full_logits_on_every_rank(world_size: int, key: str) -> None:
    want = single_process(key.split("/")[0])["logits"]
    for rank_result in results(world_size):
        torch.testing.assert_close(rank_result[key]["logits"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(480)
def test_stages_sit_on_ranks_as_in_libai() -> None:
    # pp=dp=tp=2 on 8 ranks: stage 0 on ranks 0-3, stage 1 on ranks 4-7 (TP pairs and DP pairs inside
    # each stage are checked by test_parallel_mesh); interleaved: pipeline rank r holds r and r + 2.
    per_rank = results(8)
    assert [r["gpt/pp2-dp2-tp2"]["stages"] for r in per_rank] == [[0]] * 4 + [[1]] * 4
    key = "llama4/pp2-dp2-tp2-interleaved-zero2"
    assert [r[key]["stages"] for r in per_rank] == [[0, 2]] * 4 + [[1, 3]] * 4


BAD = [
    ("gpt", {**PP2, "pipeline_schedule": "1f1b", "num_microbatches": 1}),
    ("gpt", {**PP2, **INTERLEAVED}),
    ("gpt4", {**PP2, "pipeline_layers": [1, 2]}),
    ("gpt", {**PP2, "pipeline_num_layers": 4}),
    ("gpt", {**PP2, "pipeline_schedule": "gpipe", "virtual_pipeline_size": 2}),
]
EXPECTED = [
    "num_microbatches=1 is smaller than pipeline_parallel_size=2",
    "the model has 2 layers, fewer than the 4 stages",
    "pipeline_layers: sums to 3 layers but the model has 4",
    "pipeline_num_layers=4 but the model has 2 layers",
    "virtual_pipeline_size=2 needs pipeline_schedule 'interleaved_1f1b'",
]


@pytest.mark.timeout(240)
def test_bad_pipeline_layouts_raise_on_every_rank_without_hanging() -> None:
    for messages in spawn(bad_layouts, 2, BAD, timeout=120):
        for message, expected in zip(messages, EXPECTED, strict=True):
            assert expected in message
    outcomes = spawn(bad_layout_uncaught, 2, *BAD[1], timeout=120, raise_errors=False)
    assert all(isinstance(o, RankError) and o.type_name == "ConfigError" for o in outcomes)
    # Rank 1 on the meta device, rank 0 real: refused on both, neither left waiting.
    meta = [("meta", "gpt", {**PP2, "meta_init": True})]
    outcomes = spawn(run_layouts, 2, meta, timeout=120, raise_errors=False)
    assert all(isinstance(o, RankError) and "meta device is not supported" in o.message for o in outcomes)


@pytest.mark.timeout(240)
def test_a_batch_that_does_not_split_into_microbatches_raises_on_every_rank() -> None:
    layout = {**PP2, "pipeline_schedule": "gpipe", "num_microbatches": 4}
    for messages in spawn(bad_batches, 2, "gpt", layout, [6], timeout=120):
        assert "batch of 6 rows does not split into 4 pipeline microbatches" in messages[0]


@pytest.mark.timeout(480)
def test_stage_splits_follow_device_weights_and_explicit_layers() -> None:
    per_rank = results(2)
    # 4 equal layers, the first stage 3x as fast, the last also carrying the LM head: 3 + 1.
    assert [r["gpt4/pp2-device-weights-3-1"]["stage_layers"] for r in per_rank] == [[[0, 1, 2]], [[3]]]
    assert [r["llama4/pp2-pipeline-layers-1-3"]["stage_layers"] for r in per_rank] == [[[0]], [[1, 2, 3]]]
    assert [r["gpt4/pp2-interleaved"]["stage_layers"] for r in per_rank] == [[[0], [2]], [[1], [3]]]


@pytest.mark.timeout(480)
def test_bf16_pipeline_stays_close_to_fp32() -> None:
    for loss, want in zip(
        results(2)[0]["gpt/pp2-bf16"]["losses"], single_process("gpt")["losses"], strict=True
    ):
        assert abs(loss - want) <= 2e-2 * want


@pytest.mark.timeout(240)
def test_batches_of_changing_shape_go_through_the_pipeline() -> None:
    shapes = [(4, 8), (2, 8), (4, 6)]  # new microbatch shapes get their own stages and schedule
    want = varying_batches_reference("gpt", shapes)
    for losses in spawn(varying_batches, 2, "gpt", PP2, shapes, timeout=180):
        for loss, ref in zip(losses, want, strict=True):
            assert abs(loss - ref) <= 1e-5 * ref
