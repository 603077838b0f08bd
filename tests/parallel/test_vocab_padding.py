"""A vocabulary tensor parallel does not divide, or that the model pads itself (vocab_multiple), is
padded inside the model and invisible outside: HF GPT-2's 50257 and an odd brickwork vocabulary
train like one process, and checkpoints reshard."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from vocab_padding_cases import (
    GPT2_VOCAB,
    ODD_VOCAB,
    STEPS,
    base_hidden,
    build,
    four_rank,
    generated,
    load_run,
    reference,
    tp2_rank,
    vocab_of,
)

from brickwork.errors import ConfigError
from brickwork.layout.vocab_padding import VocabPadding
from brickwork.parallel import ParallelConfig, export, spawn

pytest.importorskip("transformers")


def test_padding_is_a_multiple_of_tp_times_the_multiple() -> None:
    assert VocabPadding.for_size(GPT2_VOCAB, 2, 64).padded == 50304
    assert VocabPadding.for_size(GPT2_VOCAB, 4, 64).padded == 50432
    assert VocabPadding.for_size(ODD_VOCAB, 2, 1).padded == 102
    assert ParallelConfig.from_dict({}).vocab_multiple == 64


@pytest.mark.parametrize(("vocab", "tp", "multiple"), [(101, 2, 64), (5, 4, 1), (50257, 4, 64), (7, 3, 2)])
def test_every_real_row_keeps_its_shard_and_comes_back(vocab: int, tp: int, multiple: int) -> None:
    padding = VocabPadding.for_size(vocab, tp, multiple)
    table = torch.arange(vocab * 2, dtype=torch.float64).view(vocab, 2) + 1
    padded = padding.pad(table)
    assert padded.shape == (padding.padded, 2)
    torch.testing.assert_close(padding.unpad(padded), table, rtol=0, atol=0)
    ids = torch.arange(vocab)
    torch.testing.assert_close(padded[padding.padded_ids(ids)], table, rtol=0, atol=0)
    # Rank r's shard starts with exactly the rows torch.chunk gives it from the unpadded table.
    for rank, (shard, chunk) in enumerate(zip(padded.chunk(tp), table.chunk(tp))):
        assert padding.real_rows(rank) == len(chunk)
        torch.testing.assert_close(shard[: len(chunk)], chunk, rtol=0, atol=0)
        assert not shard[len(chunk) :].any()
    assert sum(padding.real_rows(r) for r in range(tp)) == vocab
    # Ids outside the vocabulary reach no real row (the sharded lookup gives zeros, as unpadded).
    outside = padding.padded_ids(torch.cat([torch.arange(-3, 0), torch.arange(vocab, 3 * vocab)]))
    inside = outside[(outside >= 0) & (outside < padding.padded)]
    assert not padded[inside].any()


def test_only_a_tensor_parallel_shard_is_unpadded_as_a_view() -> None:
    padding = VocabPadding.for_size(ODD_VOCAB, 2, 64)
    with pytest.raises(ValueError, match="use full_state_dict"):
        padding.unpadded_view(torch.zeros(padding.padded, 4))


@pytest.mark.parametrize("value", [0, -64, 1.5, True])
def test_a_bad_vocab_multiple_is_refused(value: object) -> None:
    with pytest.raises(ConfigError, match="vocab_multiple"):
        ParallelConfig.from_dict({"vocab_multiple": value})


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("tp2-vocab"))


@pytest.fixture(scope="module")
def tp2_results(saved: str) -> list[dict]:
    return spawn(tp2_rank, 2, saved, timeout=240)


def _check_run(run: dict, ref: dict) -> None:
    torch.testing.assert_close(torch.tensor(run["losses"]), torch.tensor(ref["losses"]), rtol=1e-5, atol=1e-5)
    if run["logits"] is not None:  # a pipeline's model has no single forward
        assert run["logits"].shape == ref["logits"].shape  # the unpadded width
        torch.testing.assert_close(run["logits"], ref["logits"], rtol=1e-5, atol=1e-5)
    assert run["state"].keys() == ref["state"].keys()
    for name, value in ref["state"].items():
        assert run["state"][name].shape == value.shape, name
        torch.testing.assert_close(run["state"][name], value, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("run", "rows"), [("gpt2-hf", 50304 // 2), ("odd", 128 // 2), ("odd-sp", 112 // 2)])
def test_tp2_trains_like_one_process(run: str, rows: int, tp2_results: list[dict]) -> None:
    ref = reference(run.removesuffix("-sp"))  # -sp: under sequence parallel, vocab_multiple 8
    assert len(ref["losses"]) == STEPS
    for rank in tp2_results:
        _check_run(rank[run], ref)
        assert rank[run]["embedding_rows"] == rows  # padded to a multiple of tp × vocab_multiple


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_an_embedding_without_a_head_is_padded_alone(tp2_results: list[dict]) -> None:
    ref = base_hidden(build("gpt2-hf").transformer)
    for rank in tp2_results:
        torch.testing.assert_close(rank["base"], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_meta_init_fills_the_padded_shards_from_rank_0(tp2_results: list[dict]) -> None:
    ref = build("odd").state_dict()
    for rank in tp2_results:
        assert rank["meta"].keys() == ref.keys()
        for name, value in ref.items():
            torch.testing.assert_close(rank["meta"][name], value, rtol=0, atol=0, msg=name)


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_tp2_generates_like_one_process(tp2_results: list[dict]) -> None:
    ref = generated(build("odd"))
    for rank in tp2_results:
        torch.testing.assert_close(rank["generated"], ref, rtol=0, atol=0)


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_a_tp2_checkpoint_reloads_in_one_process(saved: str, tp2_results: list[dict], tmp_path: Path) -> None:
    weights = load_file(export(saved, tmp_path / "odd.safetensors"))
    assert weights["token_embedding.weight"].shape[0] == ODD_VOCAB  # the export is unpadded
    build("odd").load_state_dict(weights, strict=True)
    one = load_run(saved, None)
    for rank in tp2_results:
        torch.testing.assert_close(one["logits"], rank["save"]["logits"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(one["next_loss"], rank["save"]["next_loss"], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(400)
def test_zero3_and_pipeline_over_tp2_and_a_tp4_reload(
    saved: str, tp2_results: list[dict], tmp_path: Path
) -> None:
    results = spawn(four_rank, 4, saved, str(tmp_path), timeout=360)
    ref, ref_pipeline, saved_run = reference("gpt2-hf"), reference("odd2"), tp2_results[0]["save"]
    for rank in results:
        _check_run(rank["zero3"], ref)
        _check_run(rank["pp2tp2"], ref_pipeline)
        torch.testing.assert_close(rank["tp4"]["logits"], saved_run["logits"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(rank["tp4"]["next_loss"], saved_run["next_loss"], rtol=1e-5, atol=1e-5)
        for run in ("zero3-load", "zero3-save", "ddp"):
            torch.testing.assert_close(rank[run]["logits"], saved_run["logits"], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(rank[run]["next_loss"], saved_run["next_loss"], rtol=1e-5, atol=1e-5)
    # DDP over TP keeps local shards, ZeRO-3 over TP gathers the real rows: either state is unpadded.
    for run in ("ddp", "zero3"):
        one = load_run(str(tmp_path / run), None)
        torch.testing.assert_close(one["logits"], saved_run["logits"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(one["next_loss"], saved_run["next_loss"], rtol=1e-5, atol=1e-5)


@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.parametrize("run", ["padded", "padded-zero3"])
def test_a_self_padded_model_trains_like_one_process_and_like_the_unpadded_one(
    run: str, tp2_results: list[dict]
) -> None:
    # vocab_multiple: 64 pads 101 to 128 rows, which tp=2 divides: no more rows, laid out per shard.
    padded, unpadded = reference("padded"), reference("odd")
    _check_run(padded, unpadded)  # one process: the same seed gives the very weights and losses
    for rank in tp2_results:
        _check_run(rank[run], padded)
        assert rank[run]["embedding_rows"] == 128 // 2  # split over tp=2, or over dp=2 by FSDP
        torch.testing.assert_close(rank["padded-generated"], generated(build("odd")), rtol=0, atol=0)


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_a_self_padded_zero3_checkpoint_holds_the_real_rows(
    saved: str, tp2_results: list[dict], tmp_path: Path
) -> None:
    folder = str(Path(saved) / "padded")
    weights = load_file(export(folder, tmp_path / "padded.safetensors"))
    assert weights["token_embedding.weight"].shape[0] == ODD_VOCAB  # FSDP's shards, gathered unpadded
    build("odd").load_state_dict(weights, strict=True)
    one = load_run(folder, None, "padded")
    for rank in tp2_results:
        for run in (one, rank["padded-load"]):  # in one process, and back under ZeRO-3 (written back)
            torch.testing.assert_close(run["logits"], rank["padded-save"]["logits"], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(
                run["next_loss"], rank["padded-save"]["next_loss"], rtol=1e-5, atol=1e-5
            )


def test_an_id_past_the_vocabulary_is_an_index_error_as_on_one_process(tp2_results: list[dict]) -> None:
    vocab = vocab_of("gpt2-hf")
    for result in tp2_results:
        assert result["out_of_range"] == f"token ids must be in [0, {vocab}), got ids from 1 to {vocab}"
