"""An encoder-decoder whose decoder embeds on its own (``share_embeddings: false``, xformers'
``tie_embedding_weights: false``) against a forward written out here, its pipeline stages, its
checkpoints, and the tied models it leaves as they were."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_xformers import VOCAB, readme_encoder_decoder

from brickwork.factory import (
    ConfigError,
    build_model,
    from_pretrained,
    from_xformers_config,
    get_preset,
    resolve_spec,
    save_pretrained,
    to_hf,
)
from brickwork.parallel.pipeline.stages import build_stage_modules, shared_parameters
from brickwork.xformers.factory import xFormerConfig

SEQ = 32
DECODER_EMBEDDING = ("decoder_token_embedding.weight", "decoder_position_embedding.weight")


@functools.cache
def built() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(from_xformers_config({"stack_configs": readme_encoder_decoder(SEQ)})).eval()


def untied_model() -> torch.nn.Module:
    """A fresh copy of one untied model (building it is the slow part)."""
    return copy.deepcopy(built())


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (2, SEQ), generator=generator), torch.randint(
        0, VOCAB, (2, 24), generator=generator
    )


def test_both_entry_points_give_the_decoder_its_own_embedding() -> None:
    stacks = readme_encoder_decoder(SEQ)
    spec = from_xformers_config({"stack_configs": stacks, "tie_embedding_weights": False})
    assert spec["share_embeddings"] is False
    assert from_xformers_config(xFormerConfig(stacks, tie_embedding_weights=False)) == spec
    assert from_xformers_config(stacks) == spec  # untied is xformers' default
    model = build_model(spec)
    tables = [model.token_embedding.weight, model.position_embedding.weight]
    own = [model.get_parameter(name) for name in DECODER_EMBEDDING]
    assert all(a is not b and not torch.equal(a, b) for a, b in zip(tables, own, strict=True))
    assert model.lm_head.weight is model.decoder_token_embedding.weight  # the head predicts the decoder's ids


def test_untied_model_equals_a_forward_written_out_with_four_tables() -> None:
    model = untied_model()
    src, tgt = batch()
    tables = {
        name: model.get_parameter(name).detach().clone().requires_grad_()
        for name in ("token_embedding.weight", "position_embedding.weight", *DECODER_EMBEDDING)
    }
    encoder_tokens, encoder_positions, decoder_tokens, decoder_positions = tables.values()
    h = F.embedding(src, encoder_tokens) + encoder_positions[: src.shape[1]]
    for layer in model.encoder_layers:
        h = layer(h)
    memory = model.encoder_final_norm(h)
    h = F.embedding(tgt, decoder_tokens) + decoder_positions[: tgt.shape[1]]
    for layer in model.decoder_layers:
        h = layer(h, memory=memory)
    expected = model.decoder_final_norm(h) @ decoder_tokens.T
    logits = model(src, tgt)
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    probe = torch.randn_like(logits)
    (logits * probe).sum().backward()
    (expected * probe).sum().backward()
    for name, table in tables.items():
        torch.testing.assert_close(model.get_parameter(name).grad, table.grad, rtol=1e-5, atol=1e-5, msg=name)
    # Each table learns from its own side: source rows the decoder's table never sees get nothing.
    unseen = sorted(set(src.flatten().tolist()) - set(tgt.flatten().tolist()))
    assert model.token_embedding.weight.grad[unseen].abs().sum() > 0
    assert not torch.equal(model.token_embedding.weight.grad, model.decoder_token_embedding.weight.grad)


def test_pipeline_stages_hold_each_side_its_own_embedding() -> None:
    model = untied_model()
    src, tgt = batch()
    stages = build_stage_modules(model, (1, 2, 1), range(3))
    held = [{name for name, _ in stage.named_parameters(remove_duplicate=False)} for stage in stages]
    assert "token_embedding.weight" in held[0] and not any(n in held[0] for n in DECODER_EMBEDDING)
    assert set(DECODER_EMBEDDING) <= held[1] and "token_embedding.weight" not in held[1]
    assert "decoder_position_embedding.weight" not in held[2]
    # The head, tied to the decoder's table, is summed with it over stages 1 and 2; the encoder's stays put.
    shared = [set(stages_of) for stages_of in shared_parameters(model, (1, 2, 1))]
    assert shared == [{1, 2}]
    carried: tuple = (src,)
    with torch.no_grad():
        for stage in stages:
            out = stage(*carried, decoder_input_ids=tgt)
            carried = out if isinstance(out, tuple) else (out,)
        torch.testing.assert_close(out, model(src, tgt))


def test_checkpoints_keep_the_tables_apart_and_the_head_tied(tmp_path: Path) -> None:
    model = untied_model()
    src, tgt = batch()
    save_pretrained(model, tmp_path)
    loaded = from_pretrained(tmp_path).eval()
    assert loaded.lm_head.weight is loaded.decoder_token_embedding.weight
    assert set(loaded.state_dict()) == set(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(loaded(src, tgt), model(src, tgt))


def test_tied_models_keep_their_spec_and_state_dict_keys() -> None:
    assert "share_embeddings" not in resolve_spec(get_preset("t5-small"))
    spec = from_xformers_config({"stack_configs": readme_encoder_decoder(SEQ), "tie_embedding_weights": True})
    assert "share_embeddings" not in spec and "share_embeddings" not in resolve_spec(spec)
    with torch.device("meta"):
        tied, untied = build_model(spec), build_model({**spec, "share_embeddings": False})
    assert set(DECODER_EMBEDDING) <= set(untied.state_dict())
    assert [k for k in untied.state_dict() if k not in DECODER_EMBEDDING] == list(tied.state_dict())


def test_share_embeddings_is_checked_and_to_hf_refuses_an_encoder_decoder() -> None:
    spec = from_xformers_config({"stack_configs": readme_encoder_decoder(SEQ)})
    with pytest.raises(ConfigError, match=r"^share_embeddings: "):
        build_model({**spec, "share_embeddings": "no"})
    with pytest.raises(ConfigError, match=r"^tie_embedding_weights: must be true or false"):
        from_xformers_config({"stack_configs": readme_encoder_decoder(SEQ), "tie_embedding_weights": 1})
    pytest.importorskip("transformers")
    with pytest.raises(ConfigError, match="matches no HF family brickwork can export"):
        to_hf(untied_model())


def test_the_hf_seq2seq_class_ties_its_head_to_the_decoder_embedding(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from brickwork.hf.seq2seq import BrickworkForSeq2SeqLM

    model = untied_model()
    src, tgt = batch()
    BrickworkForSeq2SeqLM.from_model(model).save_pretrained(tmp_path)
    loaded = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval().model
    assert loaded.lm_head.weight is loaded.decoder_token_embedding.weight
    assert loaded.lm_head.weight is not loaded.token_embedding.weight
    with torch.no_grad():
        torch.testing.assert_close(loaded(src, tgt), model(src, tgt))
