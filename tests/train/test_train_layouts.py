"""Every model family trains under every layout as the plain torch loop of train_cases does on one
process: dp2, tp2, ZeRO-3, pp2 (1F1B) and, on four ranks, dp2 × tp2 (and pp2 × tp2 for the HF
models). One spawned world per world size runs all the families; each test checks one case. What a
layout does not support must be refused with an error naming the limitation (docs/training.md lists
them)."""

from __future__ import annotations

import functools

import pytest
from train_cases import DIM, FAMILIES, VOCAB, check, reference

from brickwork.parallel import spawn

pytestmark = [pytest.mark.distributed]

DP2 = {"data_parallel_size": 2}
LAYOUTS_2 = {
    "dp2": DP2,
    "tp2": {"tensor_parallel_size": 2},
    "zero3": {**DP2, "zero_stage": 3},
    "pp2": {"pipeline_parallel_size": 2, "pipeline_schedule": "1f1b"},
}
EXTRA_2 = {
    "decoder/dp2-accum2": ("decoder", {**DP2, "grad_accum_steps": 2}),
    "decoder/zero3-accum2-clip": (
        "decoder",
        {**DP2, "zero_stage": 3, "grad_accum_steps": 2, "grad_clip": 0.05},
    ),
    "decoder/pp2-accum2": ("decoder", {**LAYOUTS_2["pp2"], "grad_accum_steps": 2}),
    "llama-hf/pp2": ("llama-hf", LAYOUTS_2["pp2"]),
    # Encoder layers and the first decoder layer on stage 0: (hidden, encoder output) travel to stage 1.
    "seq2seq/pp2-gpipe-3-1-accum2": (
        "seq2seq",
        {**LAYOUTS_2["pp2"], "pipeline_schedule": "gpipe", "pipeline_layers": [3, 1], "grad_accum_steps": 2},
    ),
    # One layer a stage: rank 0 holds the shared embedding twice (stages 0 and 2), reduced once.
    "seq2seq/pp2-interleaved": (
        "seq2seq",
        {**LAYOUTS_2["pp2"], "pipeline_schedule": "interleaved_1f1b", "virtual_pipeline_size": 2},
    ),
    "seq2seq/pp2-full-ac": ("seq2seq", {**LAYOUTS_2["pp2"], "activation_checkpointing": "full"}),
    "mlm/tp2-clip": ("mlm", {**LAYOUTS_2["tp2"], "grad_clip": 0.05}),
    "seq2seq/dp2-full-ac": ("seq2seq", {**DP2, "activation_checkpointing": "full"}),
    "seq2seq/zero3-selective-ac": (
        "seq2seq",
        {**DP2, "zero_stage": 3, "activation_checkpointing": "selective"},
    ),
    "bf16/zero3-mixed": (
        "mlm",
        {**DP2, "zero_stage": 3, "mixed_precision": "bf16", "precision": "bf16-mixed"},
    ),
    "moe/dp2": ("decoder", {**DP2, "moe": True}),
    "moe/zero3": ("decoder", {**DP2, "zero_stage": 3, "moe": True}),
    "moe/pp2": ("decoder", {**LAYOUTS_2["pp2"], "moe": True}),
    "callable/pp2": ("decoder", {**LAYOUTS_2["pp2"], "callable": True}),
    "callable/tp2": ("decoder", {**LAYOUTS_2["tp2"], "callable": True}),
}
CASES_2 = [(f"{f}/{name}", f, lay) for f in FAMILIES for name, lay in LAYOUTS_2.items()]
CASES_2 += [(key, family, lay) for key, (family, lay) in EXTRA_2.items()]
PP2_TP2 = {**LAYOUTS_2["pp2"], "tensor_parallel_size": 2}
CASES_4 = [(f"{f}/dp2-tp2", f, {**DP2, "tensor_parallel_size": 2}) for f in FAMILIES]
CASES_4 += [(f"{f}/pp2-tp2", f, PP2_TP2) for f in ("gpt2-hf", "llama-hf", "mlm", "vit", "seq2seq")]
CASES_4 += [("seq2seq/pp2-zero3", "seq2seq", {**LAYOUTS_2["pp2"], **DP2, "zero_stage": 3})]
SUPPORTED_2 = [key for key, _, _ in CASES_2 if not key.startswith(("moe", "callable/pp2", "bf16"))]


@functools.cache
def results(world_size: int) -> list[dict]:
    cases = CASES_2 if world_size == 2 else CASES_4
    return spawn(run_world_entry, world_size, cases, world_size == 2, timeout=480)


def run_world_entry(cases, extras):
    from train_cases import run_world

    return run_world(cases, extras)


@functools.cache
def single_process(family: str, grad_clip: float | None = None, moe: bool = False, parts: int = 1) -> dict:
    return reference(family, grad_clip, moe, parts)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("key", SUPPORTED_2)
def test_two_ranks_train_like_one_process(key: str) -> None:
    family, layout = next((f, lay) for k, f, lay in CASES_2 if k == key)
    check([r["layouts"] for r in results(2)], key, single_process(family, layout.get("grad_clip")))


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("key", "fused"),
    [
        ("decoder/dp2", 4),  # 3 steps and one evaluate
        ("decoder/zero3", 4),
        ("decoder/dp2-accum2", 7),  # 2 micro-batches a step
        ("decoder/zero3-accum2-clip", 7),
        ("moe/zero3", 4),
        ("decoder/tp2", 0),  # the head split over the vocabulary: logits and loss_parallel
        ("callable/tp2", 0),
        ("decoder/pp2", 0),  # the last stage's logits
    ],
)
def test_causal_lm_fuses_the_head_loss_wherever_the_head_weight_is_whole(key: str, fused: int) -> None:
    # Under DDP and FSDP2 the fused loss runs inside the model's call; that its gradients reach DDP's
    # all-reduce and FSDP's reduce-scatter is test_two_ranks_train_like_one_process: each rank trains
    # on other rows, yet the weights after 3 steps are the plain loop's (which takes the logits).
    for rank_result in results(2):
        calls = rank_result["layouts"][key]["head_calls"]
        assert calls["fused"] == fused, calls
        if fused:
            assert calls["logits"] == 0, calls
            # FSDP2 hands the forward the whole, unsharded head weight (tied to the embedding).
            assert calls["weights"] == [["Parameter", [-(-VOCAB // 64) * 64, DIM]]], calls  # padded rows
        elif "pp2" not in key:
            assert calls["logits"] > 0, calls


@pytest.mark.timeout(600)
def test_asking_a_tensor_parallel_decoder_for_its_fused_loss_is_refused() -> None:
    for rank_result in results(2):
        message = rank_result["labels_under_tp"]
        assert "tensor parallel splits it over the vocabulary" in message, message
        assert "vocab_parallel_cross_entropy" in message


@pytest.mark.timeout(600)
def test_bf16_mixed_under_zero3_uses_fsdp_policy_and_stays_close() -> None:
    # bf16 compute (FSDP's MixedPrecisionPolicy) against the fp32 loop: close, not equal.
    check([r["layouts"] for r in results(2)], "bf16/zero3-mixed", single_process("mlm"), tol=3e-2)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("callable/pp2", "a callable task cannot run under pipeline parallel"),
        ("moe/pp2", "MoE load-balancing loss (aux_loss_weight > 0) is not supported under pipeline parallel"),
    ],
)
def test_what_a_pipeline_cannot_split_is_refused(key: str, words: str) -> None:
    for rank_result in results(2):
        assert words in rank_result["layouts"][key].get("error", "no error")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("key", ["moe/dp2", "moe/zero3"])
def test_moe_with_a_starved_expert_trains_under_data_parallel(key: str) -> None:
    per_rank = [r["layouts"] for r in results(2)]
    # The aux loss of each rank's rows, weighted by its positions: the reference computes it per half.
    check(per_rank, key, single_process("decoder", None, True, 2))
    first_step = per_rank[0][key]["expert_counts"][0]
    assert len(first_step) == 2  # one count vector per MoE layer, summed over dp
    assert all(layer[-1] == 0 for layer in first_step), first_step
    assert all(sum(layer) == 4 * 8 for layer in first_step)  # every token went to one expert


@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", ["dp2", "zero3", "tp2"])
def test_fp16_overflow_skips_exactly_that_step_on_every_rank(layout: str) -> None:
    for rank_result in results(2):
        record = rank_result["fp16"][layout]["record"]
        assert [r["skipped"] for r in record] == [False, True, False]
        assert [r["changed"] for r in record] == [True, False, True]
        assert record[1]["scale"] == record[0]["scale"] / 2


@pytest.mark.timeout(600)
def test_different_batches_on_tensor_parallel_peers_raise_on_every_rank() -> None:
    for rank_result in results(2):
        assert "passed a batch different from rank 0's" in rank_result["mismatch"]
        assert "tensor/pipeline-parallel group [0, 1]" in rank_result["mismatch"]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("family", FAMILIES)
def test_dp2_tp2_on_four_ranks_trains_like_one_process(family: str) -> None:
    check([r["layouts"] for r in results(4)], f"{family}/dp2-tp2", single_process(family))


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "key",
    [
        "gpt2-hf/pp2-tp2",
        "llama-hf/pp2-tp2",
        "mlm/pp2-tp2",
        "vit/pp2-tp2",
        "seq2seq/pp2-tp2",
        "seq2seq/pp2-zero3",
    ],
)
def test_pipelines_with_tensor_or_data_parallel_on_four_ranks_train_like_one_process(key: str) -> None:
    check([r["layouts"] for r in results(4)], key, single_process(key.split("/")[0]))
