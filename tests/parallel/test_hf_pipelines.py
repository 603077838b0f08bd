"""Unmodified HF GPT-NeoX and BERT models under pipeline parallel: embeddings on the first stage, the
head on the last, trained at pp=2 (1F1B) and pp2 × tp2 like one process; BERT at dp2 × tp2 too (DDP
and ZeRO-3); Qwen2 (a full and a sliding-window layer) and Mixtral at pp=2."""

from __future__ import annotations

import pytest
import torch
from hf_pipeline_cases import causal_reference, four_rank, pp2_rank
from hf_plan_cases import build, mlm_reference

from brickwork.errors import ConfigError
from brickwork.parallel import spawn
from brickwork.parallel.pipeline.stages import stage_recipe

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def pp2_results() -> list[dict]:
    return spawn(pp2_rank, 2, timeout=200)


def _same(run: dict, ref: tuple[list[float], dict[str, torch.Tensor]]) -> None:
    ref_losses, ref_state = ref
    torch.testing.assert_close(torch.tensor(run["losses"]), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    assert run["state"].keys() == ref_state.keys()
    for name, value in ref_state.items():
        torch.testing.assert_close(run["state"][name], value, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_gpt_neox_at_pp2_trains_like_one_process(pp2_results: list[dict]) -> None:
    first, last = (rank["gpt_neox"]["stage_parameters"][0] for rank in pp2_results)
    assert "gpt_neox.embed_in.weight" in first and "gpt_neox.embed_in.weight" not in last
    assert "lm_head.weight" in last and "gpt_neox.final_layer_norm.weight" in last
    assert "gpt_neox.layers.0.attention.dense.weight" in first
    assert "gpt_neox.layers.1.attention.dense.weight" in last
    ref = causal_reference("gpt_neox")
    for rank in pp2_results:
        _same(rank["gpt_neox"], ref)


@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize("family", ["qwen2", "mixtral"])
def test_llama_shaped_models_at_pp2_train_like_one_process(family: str, pp2_results: list[dict]) -> None:
    first, last = (rank[family]["stage_parameters"][0] for rank in pp2_results)
    assert "model.embed_tokens.weight" in first and "lm_head.weight" in last
    assert any(".layers.0." in name for name in first) and not any(".layers.0." in name for name in last)
    ref = causal_reference(family)
    for rank in pp2_results:
        _same(rank[family], ref)


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_bert_masked_lm_at_pp2_trains_like_one_process(pp2_results: list[dict]) -> None:
    first, last = (rank["bert"]["stage_parameters"][0] for rank in pp2_results)
    assert "bert.embeddings.token_type_embeddings.weight" in first
    # The tied decoder weight is held by both ends: the word embedding first, the MLM head last.
    assert "bert.embeddings.word_embeddings.weight" in first
    assert "cls.predictions.transform.dense.weight" in last
    assert not any(name.startswith("bert.embeddings") for name in last if "word_embeddings" not in name)
    ref = mlm_reference()
    for rank in pp2_results:
        _same(rank["bert"], ref)


def test_a_model_without_the_head_its_recipe_needs_is_refused() -> None:
    with pytest.raises(ConfigError, match="BertForMaskedLM"):
        stage_recipe(build("bert", head=False))
    with pytest.raises(ConfigError, match=r"splits LlamaForCausalLM .*; LlamaModel is not one"):
        stage_recipe(build("llama", head=False))


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(400)
def test_pp2_tp2_and_bert_at_dp2_tp2_with_and_without_zero3_train_like_one_process() -> None:
    results = spawn(four_rank, 4, timeout=360)
    neox, bert = causal_reference("gpt_neox"), mlm_reference()
    for rank in results:
        _same(rank["gpt_neox"], neox)
        _same(rank["bert"], bert)
        for key in ("bert-dp2-tp2", "bert-dp2-tp2-zero3"):
            losses, state, tied = rank[key]
            assert tied  # cls.predictions.bias follows the split decoder.bias
            _same({"losses": losses, "state": state}, bert)
