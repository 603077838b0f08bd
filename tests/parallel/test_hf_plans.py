"""Plans for unmodified HF models: picked by model type, complete, checked, and exact at tp=2; HF
models converted by from_hf, at tp=2 (Qwen2, Qwen3) and at dp2 × ep2 (Mixtral), exact against the HF
original in one process."""

from __future__ import annotations

import pytest
import torch
from hf_plan_cases import (
    CONVERTED,
    FAMILIES,
    PLANNED,
    build,
    build_classifier,
    classifier_logits,
    mlm_reference,
    tp2_rank,
    train,
)
from torch import nn

from brickwork.errors import ConfigError
from brickwork.parallel import spawn
from brickwork.parallel.plans import plan_for
from brickwork.parallel.tensor.checks import check_tensor_parallel
from brickwork.parallel.tensor.plan import name_plan

pytest.importorskip("transformers")


@pytest.mark.parametrize("head", [True, False], ids=["task-head", "base"])
@pytest.mark.parametrize("family", PLANNED)
def test_every_linear_in_the_blocks_is_split(family: str, head: bool) -> None:
    model = build(family, head=head)
    plan = plan_for(model)
    entries = {entry.path: entry.style for entry in name_plan(model, plan.plan)}
    check_tensor_parallel(model, name_plan(model, plan.plan), 2)
    plan.check(2)
    linears = [
        name for name, m in model.named_modules() if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D"
    ]
    assert linears and all(name in entries for name in linears), sorted(set(linears) - set(entries))
    assert list(entries.values()).count("vocab") == 1


def test_a_split_through_a_head_is_refused() -> None:
    with pytest.raises(ConfigError, match="num_key_value_heads=2 is not divisible by tensor_parallel_size=4"):
        plan_for(build("llama")).check(4)


def test_bert_pairs_each_projection_with_its_partner_per_layer() -> None:
    entries = {e.path: e for e in name_plan(build("bert"), plan_for(build("bert")).plan)}
    # The attention's out projection and the MLP's are both "output.dense"; each has its own owner.
    assert entries["bert.encoder.layer.1.attention.output.dense"].owner == "bert.encoder.layer.1.attention"
    assert entries["bert.encoder.layer.1.attention.self.query"].owner == "bert.encoder.layer.1.attention"
    assert entries["bert.encoder.layer.1.output.dense"].owner == "bert.encoder.layer.1"
    assert entries["bert.encoder.layer.1.output.dense"].style == "rowwise"
    assert entries["cls.predictions.decoder"].style == "colwise"
    assert entries["cls.predictions.transform.dense"].style == "replicate"
    classifier = {e.path: e.style for e in name_plan(build_classifier(), plan_for(build_classifier()).plan)}
    assert classifier["bert.pooler.dense"] == classifier["classifier"] == "replicate"


def test_a_plan_child_that_does_not_exist_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"plan\.encoder\.layer\.0\.nothing\.dense"):
        name_plan(build("bert", head=False), {"encoder.layer.0": {"nothing.dense": "colwise"}})
    with pytest.raises(ConfigError, match="unknown tensor-parallel style"):
        name_plan(build("bert", head=False), {"encoder.layer.0": {"output.dense": "rowise"}})


def test_models_without_a_plan_get_none() -> None:
    assert plan_for(nn.Linear(2, 2)) is None


@pytest.fixture(scope="module")
def tp2_results() -> list[dict]:
    return spawn(tp2_rank, 2, timeout=200)


@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize("family", FAMILIES)
def test_tp2_trains_like_one_process(family: str, tp2_results: list[dict]) -> None:
    ref_losses, ref_logits, ref_state = train(build(family))
    for losses, logits, state in (rank[family] for rank in tp2_results):
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
        assert state.keys() == ref_state.keys()
        for name, value in ref_state.items():
            torch.testing.assert_close(state[name], value, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_bert_masked_lm_at_tp2_trains_like_one_process(tp2_results: list[dict]) -> None:
    ref_losses, ref_state = mlm_reference()
    for losses, state, tied in (rank["bert"] for rank in tp2_results):
        assert tied  # cls.predictions.bias follows the split decoder.bias
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
        assert state.keys() == ref_state.keys()
        for name, value in ref_state.items():
            torch.testing.assert_close(state[name], value, rtol=1e-5, atol=1e-5, msg=name)
    ref_logits = classifier_logits(build_classifier())
    for rank in tp2_results:
        torch.testing.assert_close(rank["bert-classifier"], ref_logits, rtol=1e-5, atol=1e-5)


def _same_training(got: tuple, want: tuple) -> None:
    (losses, state), (ref_losses, ref_state) = got, want
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    assert state.keys() == ref_state.keys()
    for name, value in ref_state.items():
        torch.testing.assert_close(state[name], value, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize("family", CONVERTED)
def test_a_converted_model_at_tp2_trains_like_the_hf_original(family: str, tp2_results: list[dict]) -> None:
    ref_losses, ref_logits, ref_state = train(build(family))
    for losses, logits, state in (rank["converted"][family] for rank in tp2_results):
        _same_training((losses, state), (ref_losses, ref_state))
        torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_converted_mixtral_at_ep2_trains_like_the_hf_original(tp2_results: list[dict]) -> None:
    ref_losses, _, ref_state = train(build("mixtral"))
    assert [rank["mixtral-ep2"][2] for rank in tp2_results] == [[[0, 1]] * 2, [[2, 3]] * 2]
    for losses, state, _ in (rank["mixtral-ep2"] for rank in tp2_results):
        _same_training((losses, state), (ref_losses, ref_state))
