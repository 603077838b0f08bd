"""Context parallel: every rank holds a slice of each sequence and trains like one process.

One spawned world per size runs all its layouts (context_parallel_cases.run_world); each test checks
one of them against the single-process run of the same model, seed and data: the first batch's
logits slice by slice, the loss of 3 SGD steps, the weights after, and an evaluation.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from context_parallel_cases import build, run_world, single_process
from parallel_cases import STEPS, batches

from brickwork.parallel import load_checkpoint, spawn

pytestmark = [pytest.mark.distributed]

CP2 = {"context_parallel_size": 2}
# Rotary (llama, with GQA), learned (gpt, fused qkv), sine and ALiBi positions, and a bidirectional encoder.
CASES_2 = [(kind, kind, CP2) for kind in ("llama", "gpt", "sine", "alibi", "encoder")]
CASES_2 += [("gpt/full-ac", "gpt", {**CP2, "activation_checkpointing": "full"})]
CASES_4 = [
    ("llama/cp2-dp2", "llama", {**CP2, "data_parallel_size": 2}),
    ("gpt/cp2-dp2-zero3", "gpt", {**CP2, "data_parallel_size": 2, "zero_stage": 3}),
    ("llama/cp2-tp2", "llama", {**CP2, "tensor_parallel_size": 2}),
    ("gpt/cp2-tp2-sp", "gpt", {**CP2, "tensor_parallel_size": 2, "sequence_parallel": True}),
    ("gpt/cp2-pp2", "gpt", {**CP2, "pipeline_parallel_size": 2}),
]
MESHES_4 = [{**CP2, "data_parallel_size": 2}, {**CP2, "tensor_parallel_size": 2}]


SAVED = "gpt/cp2-dp2-zero3"  # saves a checkpoint after training, in the checkpoint_root folder


@functools.cache
def results(world_size: int, checkpoint_root: str = "") -> list[dict]:
    if world_size == 2:
        return spawn(run_world, 2, CASES_2, True, [], timeout=240)
    cases = [
        (k, kind, {**lay, "save_to": checkpoint_root} if k == SAVED else lay) for k, kind, lay in CASES_4
    ]
    return spawn(run_world, 4, cases, False, MESHES_4, timeout=360)


@pytest.fixture(scope="module")
def checkpoint_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cp-checkpoint")


def check_against_one_process(per_rank: list[dict], key: str, kind: str) -> None:
    ref = single_process(kind)
    got = per_rank[0][key]
    for rank_result in per_rank:
        assert rank_result[key]["losses"] == got["losses"], "ranks returned different losses"
        want = ref["logits"].chunk(2, dim=1)[rank_result[key]["cp_rank"]]
        torch.testing.assert_close(rank_result[key]["logits"], want, rtol=0, atol=1e-5)
    assert len(got["losses"]) == STEPS
    for step, (loss, want) in enumerate(zip(got["losses"], ref["losses"])):
        assert abs(loss - want) <= 1e-5 * abs(want), f"step {step}: loss {loss} vs one process {want}"
    assert abs(got["eval"] - ref["eval"]) <= 1e-5 * abs(ref["eval"])
    assert got["state"].keys() == ref["state"].keys()
    for name, want in ref["state"].items():
        torch.testing.assert_close(
            got["state"][name], want, rtol=0, atol=1e-5, msg=f"{name} after {STEPS} steps"
        )
        assert torch.equal(per_rank[-1][key]["state"][name], got["state"][name]), (
            f"{name} differs between ranks"
        )


@pytest.mark.timeout(300)
@pytest.mark.parametrize("key", [key for key, _, _ in CASES_2])
def test_cp2_matches_one_process(key: str) -> None:
    kind = key.split("/")[0]
    check_against_one_process(results(2), key, kind)
    # The check has teeth: the second half alone, at positions from 0 and without the first half's
    # keys, is not what the second cp rank computed.
    ids = batches()[0][0]
    with torch.no_grad():
        alone = build(kind)(ids.chunk(2, dim=1)[1])
    assert not torch.allclose(alone, single_process(kind)["logits"].chunk(2, dim=1)[1], atol=1e-3)


@pytest.mark.timeout(300)
def test_runtime_refusals_are_clear_on_every_rank() -> None:
    for rank_result in results(2):
        odd, padding, direct_mask, cache, long, all_ones = rank_result["refusals"]
        assert "sequence length 7" in odd and "context_parallel_size=2" in odd
        assert "attention_mask marks padding" in padding
        assert "takes no attn_mask" in direct_mask
        assert "takes no cache" in cache
        assert "reach position 18, beyond max_seq_len=16" in long
        assert torch.isfinite(torch.tensor(float(all_ones)))


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("key", [key for key, _, _ in CASES_4])
def test_cp2_composes_with_dp_tp_and_pp_on_four_ranks(key: str, checkpoint_root: Path) -> None:
    check_against_one_process(results(4, str(checkpoint_root)), key, key.split("/")[0])


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_checkpoint_saved_at_cp2_dp2_zero3_loads_in_one_process(checkpoint_root: Path) -> None:
    results(4, str(checkpoint_root))
    model = build("gpt")
    assert load_checkpoint(checkpoint_root, model)["step"] == STEPS
    for name, want in single_process("gpt")["state"].items():
        torch.testing.assert_close(model.state_dict()[name], want, rtol=0, atol=1e-5, msg=name)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_mesh_puts_cp_between_dp_and_tp(checkpoint_root: Path) -> None:
    dp_cp = [r["mesh_groups"][0] for r in results(4, str(checkpoint_root))]
    assert [g["cp"] for g in dp_cp] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [g["dp"] for g in dp_cp] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert all(g["replicas"] == [0, 1, 2, 3] and g["tp"] == [rank] for rank, g in enumerate(dp_cp))
    cp_tp = [r["mesh_groups"][1] for r in results(4, str(checkpoint_root))]
    assert [g["tp"] for g in cp_tp] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [g["cp"] for g in cp_tp] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert all(g["replicas"] == g["cp"] for g in cp_tp)
