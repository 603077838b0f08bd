"""HF -> brickwork -> HF for GPT-2, BERT, Llama and GPT-NeoX: same outputs, same weights back."""

import pytest
import torch
from hf_models import VOCAB, assert_close, fill_nan, hf_model, logits_of

from brickwork.factory import build_model
from brickwork.factory.hf import from_hf, hf_state_to_brickwork, to_hf

FAMILIES = ["gpt2", "bert", "llama", "gpt_neox"]


def _inputs(family: str, batch: int = 3, length: int = 13) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    inputs = {"input_ids": torch.randint(0, VOCAB, (batch, length), generator=g)}
    if family == "bert":
        inputs["token_type_ids"] = torch.randint(0, 3, (batch, length), generator=g)
    return inputs


def _nan_filled_conversion(hf: torch.nn.Module) -> torch.nn.Module:
    """Build the spec's model, fill it with NaN, then load the converted weights strictly."""
    spec, state = hf_state_to_brickwork(hf.config, type(hf).__name__, hf.state_dict())
    model = build_model(spec).eval()
    fill_nan(model)
    model.load_state_dict(state, strict=True)
    return model


@pytest.mark.parametrize("family", FAMILIES)
def test_outputs_match_hf(family: str) -> None:
    hf = hf_model(family)
    model = _nan_filled_conversion(hf)
    inputs = _inputs(family)
    with torch.no_grad():
        ref = logits_of(hf, **inputs)
        ours = model(**inputs)
    assert_close(ours, ref)
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


@pytest.mark.parametrize("family", FAMILIES)
def test_from_hf_keeps_spec_dtype_and_mode(family: str) -> None:
    hf = hf_model(family, seed=3)
    model = from_hf(hf)
    assert model.spec["vocab_size"] == VOCAB
    assert not model.training
    rebuilt = build_model(model.spec)
    assert sorted(rebuilt.state_dict()) == sorted(model.state_dict())
    inputs = _inputs(family, batch=2, length=9)
    with torch.no_grad():
        assert_close(model(**inputs), logits_of(hf, **inputs))


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_outputs_match_hf(family: str) -> None:
    hf = hf_model(family, seed=1).to(torch.bfloat16)
    model = from_hf(hf)
    assert next(model.parameters()).dtype == torch.bfloat16
    inputs = _inputs(family)
    with torch.no_grad():
        ref = logits_of(hf, **inputs)
        ours = model(**inputs)
    assert ours.dtype == torch.bfloat16
    # bf16 keeps 8 bits of mantissa; three layers of differently ordered sums drift by a few ulps.
    assert_close(ours, ref, atol=0.1, rtol=3e-2)


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_gives_identical_state_and_outputs(family: str) -> None:
    hf = hf_model(family, seed=2)
    back = to_hf(from_hf(hf))
    assert type(back) is type(hf)
    ours, theirs = back.state_dict(), hf.state_dict()
    assert sorted(ours) == sorted(theirs)
    for key, value in theirs.items():
        assert torch.equal(ours[key], value), key
    inputs = _inputs(family)
    with torch.no_grad():
        assert torch.equal(logits_of(back, **inputs), logits_of(hf, **inputs))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_padded_vocabulary_converts_by_its_real_rows(family: str) -> None:
    hf = hf_model(family, seed=4)
    model = from_hf(hf, vocab_multiple=64)
    assert model.spec["vocab_size"] == VOCAB and model.spec["vocab_multiple"] == 64
    assert model.token_embedding.weight.shape[0] == 64
    inputs = _inputs(family)
    with torch.no_grad():
        assert_close(model(**inputs), logits_of(hf, **inputs))
    back = to_hf(model)  # HF's own vocabulary: the real rows
    for key, value in hf.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key
    with torch.no_grad():
        assert torch.equal(logits_of(back, **inputs), logits_of(hf, **inputs))


def test_variants_with_pooler_and_untied_heads() -> None:
    """BertModel with its pooler, and Llama / GPT-NeoX with tied and untied LM heads."""
    import transformers

    bert = hf_model("bert", model_class=transformers.BertModel)
    model = from_hf(bert)
    assert model.pooler is not None
    inputs = _inputs("bert")
    with torch.no_grad():
        out = bert(**inputs)
        hidden = model(**inputs)
        assert_close(hidden, out.last_hidden_state)
        assert_close(model.pool(hidden), out.pooler_output)
    assert "pooler.dense.weight" in to_hf(model).state_dict()

    for family, tie in (("llama", True), ("gpt_neox", True), ("gpt2", False)):
        hf = hf_model(family, tie_word_embeddings=tie)
        model = from_hf(hf)
        assert (model.lm_head.weight is model.token_embedding.weight) == tie
        inputs = _inputs(family)
        with torch.no_grad():
            assert_close(model(**inputs), logits_of(hf, **inputs))
        assert torch.equal(to_hf(model).lm_head.weight, hf.lm_head.weight)


@pytest.mark.parametrize(
    "family,overrides",
    [
        ("gpt_neox", dict(use_parallel_residual=False, rotary_pct=1.0, attention_bias=False)),
        ("gpt2", dict(scale_attn_by_inverse_layer_idx=True, activation_function="relu")),
        ("gpt2", dict(scale_attn_weights=False)),
        ("bert", dict(hidden_act="relu")),  # the MLM head's transform uses hidden_act too
        ("llama", dict(attention_bias=True, mlp_bias=True, head_dim=8, hidden_act="gelu")),
        ("llama", dict(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0})),
        ("llama", dict(rope_parameters={"rope_type": "llama3", "factor": 8.0, "rope_theta": 1000.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 16})),
        ("llama", dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1000.0,
                                        "original_max_position_embeddings": 16})),
    ],
)  # fmt: skip
def test_config_options_are_honoured(family: str, overrides: dict) -> None:
    hf = hf_model(family, seed=4, **overrides)
    model = _nan_filled_conversion(hf)
    inputs = _inputs(family, length=20)
    with torch.no_grad():
        ref = logits_of(hf, **inputs)
        assert_close(model(**inputs), ref)
    back = to_hf(from_hf(hf))
    for key, value in hf.state_dict().items():
        assert torch.equal(back.state_dict()[key], value), key
    with torch.no_grad():
        assert torch.equal(logits_of(back, **inputs), ref)
