"""Pipeline stages of every family, in one process: which modules each stage holds (under the
model's own names), and that running the stages one after the other, passing what each returns to
the next and the batch's other inputs to all, gives the whole model's output for every split."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from train_cases import build, forward, global_batches, logits_of, spec

from brickwork.errors import ConfigError
from brickwork.factory import build_model
from brickwork.parallel.config import ParallelConfig
from brickwork.parallel.pipeline.stages import build_stage_modules, shared_parameters, stage_layer_counts

FIRST_INPUT = {"vit": "pixel_values"}


def run_stages(model: nn.Module, family: str, counts: tuple[int, ...], batch: dict) -> torch.Tensor:
    stages = build_stage_modules(model, counts, range(len(counts)))
    first = FIRST_INPUT.get(family, "input_ids")
    extras = {k: v for k, v in batch.items() if k not in (first, "labels")}
    carried = (batch[first],)
    for stage in stages:
        out = stage(*carried, **extras)
        carried = out if isinstance(out, tuple) else (out,)
    return out


@pytest.mark.parametrize(
    ("family", "counts"),
    [
        ("vit", (1, 1)),
        ("mlm", (1, 1)),
        ("seq2seq", (2, 2)),
        ("seq2seq", (1, 3)),
        ("seq2seq", (3, 1)),
        ("seq2seq", (1, 1, 1, 1)),
        ("gpt2-hf", (1, 1)),
        ("llama-hf", (1, 1)),
    ],
)
@torch.no_grad()
def test_stages_in_turn_give_the_model_output(family: str, counts: tuple[int, ...]) -> None:
    model = build(family).eval()
    batch = global_batches(family)[0]
    torch.testing.assert_close(run_stages(model, family, counts, batch), forward(model, family, batch))


@pytest.mark.parametrize("family", ["vit", "mlm", "seq2seq", "gpt2-hf", "llama-hf"])
def test_stages_hold_slices_of_the_model_under_its_names(family: str) -> None:
    model = build(family)
    stages = build_stage_modules(model, (2, 2) if family == "seq2seq" else (1, 1), range(2))
    names = [set(stage.state_dict()) for stage in stages]
    assert names[0] | names[1] == set(model.state_dict())
    params = dict(model.named_parameters(remove_duplicate=False))
    for stage in stages:
        for name, param in stage.named_parameters(remove_duplicate=False):
            assert param is params[name]


def test_a_vit_class_token_and_position_table_sit_on_the_first_stage() -> None:
    first, last = build_stage_modules(build("vit"), (1, 1), range(2))
    held = [dict(first.named_parameters()), dict(last.named_parameters())]
    assert "class_token" in held[0] and "class_token" not in held[1]
    assert any(n.startswith("position_embedding") for n in held[0])
    assert any(n.startswith("classifier") for n in held[1])


def test_encoder_decoder_stages_as_in_megatron_t5() -> None:
    model = build("seq2seq")
    encoder, decoder = build_stage_modules(model, (2, 2), range(2))
    enc = {n.split(".")[0] for n, _ in encoder.named_parameters(remove_duplicate=False)}
    dec = {n.split(".")[0] for n, _ in decoder.named_parameters(remove_duplicate=False)}
    assert "token_embedding" in enc and "decoder_layers" not in enc
    assert {"token_embedding", "encoder_final_norm", "decoder_layers", "lm_head"} <= dec
    assert "encoder_layers" not in dec
    # The shared embedding (and the tied head) is held by both stages; its gradients are summed.
    assert any(
        set(held) == {0, 1} and "token_embedding.weight" in held.values()
        for held in shared_parameters(model, (2, 2))
    )


@pytest.mark.parametrize("family", ["gpt2-hf", "llama-hf"])
def test_hf_stages_hold_the_embedding_first_and_the_head_last(family: str) -> None:
    model = build(family)
    first, last = build_stage_modules(model, (1, 1), range(2))
    base = "transformer" if family == "gpt2-hf" else "model"
    embed = "wte" if family == "gpt2-hf" else "embed_tokens"
    first_names, last_names = set(first.state_dict()), set(last.state_dict())
    assert f"{base}.{embed}.weight" in first_names and "lm_head.weight" in last_names
    assert any(n.startswith(f"{base}.{'ln_f' if family == 'gpt2-hf' else 'norm'}") for n in last_names)
    if family == "gpt2-hf":
        assert "transformer.wpe.weight" in first_names and "transformer.wpe.weight" not in last_names


def test_a_model_no_recipe_fits_is_refused_naming_what_a_pipeline_splits() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    with pytest.raises(ConfigError, match="lacks embed or head"):
        stage_layer_counts(model, ParallelConfig.from_dict({"pipeline_parallel_size": 2}, world_size=2))


def test_a_reversible_stack_is_refused() -> None:
    spec_ = spec("decoder")
    spec_["decoder"]["reversible"] = True
    with pytest.raises(ConfigError, match="cannot split the reversible stack 'layers'"):
        stage_layer_counts(
            build_model(spec_), ParallelConfig.from_dict({"pipeline_parallel_size": 2}, world_size=2)
        )


@pytest.mark.parametrize("family", ["decoder", "gpt2-hf", "llama-hf"])
@torch.no_grad()
def test_causal_lm_stages_take_a_padding_mask(family: str) -> None:
    model = build(family).eval()
    ids = global_batches(family)[0]["input_ids"]
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0
    got = run_stages(model, family, (1, 1), {"input_ids": ids, "attention_mask": mask})
    unmasked = run_stages(model, family, (1, 1), {"input_ids": ids})
    torch.testing.assert_close(got, logits_of(model(ids, attention_mask=mask)))
    assert not torch.allclose(got, unmasked)  # the mask did reach the layers
