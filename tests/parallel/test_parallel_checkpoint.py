"""Distributed checkpoints: saved under (pp2, tp2), resumed under dp2 and in one process with the
losses of an uninterrupted run; a killed save is never loaded; export gives a single-file model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from checkpoint_cases import (
    SAVE_AT,
    batches,
    load_and_resume,
    resume_in_one_process,
    save_killed_before_marker,
    train_and_save,
    uninterrupted,
)
from parallel_cases import build
from safetensors import safe_open
from safetensors.torch import load_file

from brickwork.factory import build_model
from brickwork.parallel import SpawnError, export, is_complete, load_checkpoint, spawn

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

PP2_TP2 = {"pipeline_parallel_size": 2, "tensor_parallel_size": 2}
# gpt: tied embedding across the first and last stage, SGD momentum; llama: AdamW (step counts too).
SAVED = [("gpt", "gpt", PP2_TP2, "sgd"), ("llama", "llama", PP2_TP2, "adamw")]
DP2 = {"data_parallel_size": 2}
RESUMED = [
    case
    for key, kind, _, opt in SAVED
    for case in (
        (f"{key}/dp2", key, kind, DP2, opt),
        (f"{key}/zero1", key, kind, {**DP2, "zero_stage": 1}, opt),
    )
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The checkpoints saved at step SAVE_AT under (pp2, tp2) on 4 ranks, and rank 0's report."""
    root = tmp_path_factory.mktemp("checkpoints")
    return root, spawn(train_and_save, 4, str(root), SAVED, timeout=300)[0]


def close_losses(got: list[float], want: list[float]) -> None:
    assert len(got) == len(want)
    for step, (a, b) in enumerate(zip(got, want)):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {step}: {a} vs uninterrupted {b}"


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("key", "kind", "opt"), [(k, kind, o) for k, kind, _, o in SAVED])
def test_resume_under_dp2_and_in_one_process_equals_the_uninterrupted_run(
    saved: tuple[Path, dict], key: str, kind: str, opt: str
) -> None:
    root, before = saved
    want = uninterrupted(kind, opt)
    close_losses(before[key]["losses"], want[:SAVE_AT])
    folder = root / key
    assert is_complete(folder)
    cases = [c for c in RESUMED if c[1] == key]
    resumed = spawn(load_and_resume, 2, str(root), cases, timeout=300)
    for rank_result in resumed:
        for result_key, *_ in cases:
            close_losses(rank_result[result_key]["losses"], want[SAVE_AT:])
        meta = rank_result[f"{key}/dp2"]["meta"]
        assert meta["step"] == SAVE_AT and meta["extra"] == {"key": key} and meta["world_size"] == 4
        assert meta["dist"]["pipeline_parallel_size"] == 2 and meta["dist"]["tensor_parallel_size"] == 2
        assert meta["spec"] == build(kind).spec
    losses, _ = resume_in_one_process(folder, kind, opt)
    close_losses(losses, want[SAVE_AT:])


@pytest.mark.timeout(600)
def test_pp2_tp2_then_one_process_then_dp2_tp2_zero3(saved: tuple[Path, dict]) -> None:
    # (pp2, tp2) -> one plain process for a step, saved again -> (dp2, tp2) with FSDP2 shards.
    root, _ = saved
    want = {kind: uninterrupted(kind, opt) for _, kind, _, opt in SAVED}
    for key, kind, _, opt in SAVED:
        losses, _ = resume_in_one_process(
            root / key, kind, opt, stop_at=SAVE_AT + 1, save_to=root / f"{key}-one"
        )
        close_losses(losses, want[kind][SAVE_AT : SAVE_AT + 1])
    layout = {**DP2, "tensor_parallel_size": 2, "zero_stage": 3}
    cases = [(key, f"{key}-one", kind, layout, opt) for key, kind, _, opt in SAVED]
    for rank_result in spawn(load_and_resume, 4, str(root), cases, timeout=300):
        for key, kind, _, _ in SAVED:
            assert (
                rank_result[key]["meta"]["step"] == SAVE_AT + 1 and rank_result[key]["meta"]["dist"] is None
            )
            close_losses(rank_result[key]["losses"], want[kind][SAVE_AT + 1 :])


@pytest.mark.timeout(600)
def test_export_gives_a_single_file_model_with_the_same_logits(
    saved: tuple[Path, dict], tmp_path: Path
) -> None:
    root, before = saved
    out = export(root / "gpt", tmp_path / "gpt.safetensors")
    with safe_open(str(out), "pt") as handle:
        metadata = handle.metadata()
    assert metadata["step"] == str(SAVE_AT)
    model = build_model(json.loads(metadata["spec"]))
    model.load_state_dict(load_file(str(out)), strict=True)
    assert model.lm_head.weight is model.token_embedding.weight  # still tied after loading
    with torch.no_grad():
        logits = model(batches()[0][0])
    torch.testing.assert_close(logits, before["gpt"]["logits"], rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(300)
def test_a_save_killed_before_its_marker_is_never_loaded(saved: tuple[Path, dict], tmp_path: Path) -> None:
    root, _ = saved
    folder = tmp_path / "overwritten"
    # A complete checkpoint, then a save over it that dies after writing all its data.
    shutil.copytree(root / "gpt", folder)
    assert is_complete(folder)
    with pytest.raises((SpawnError, TimeoutError)):
        spawn(
            save_killed_before_marker,
            2,
            str(folder),
            "gpt",
            {"pipeline_parallel_size": 2},
            timeout=60,
            error_grace=5,
        )
    assert json.loads((folder / "meta.json").read_text())["step"] == 1  # the new save got that far
    assert not is_complete(folder)
    model = build("gpt")
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        load_checkpoint(folder, model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        export(folder, tmp_path / "never.safetensors")
