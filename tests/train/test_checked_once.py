"""A checkpoint's files are checked against their manifest once per use, since the check reads every
byte: ``brickwork export`` of a run checks the newest checkpoint as it picks it, and loading after a
check (as resume does) may skip it; ``brickwork sample`` reads a run's newest checkpoint without
checking it again; a folder given directly is still checked."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

from brickwork.checkpoint import CorruptCheckpointError, read_export, verify_checkpoint
from brickwork.factory import build_model
from brickwork.parallel import load_checkpoint, save_checkpoint
from brickwork.train.checkpoint import export_run
from brickwork.train.trained_model import load_trained


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    calls: list[Path] = []

    def verify(folder: Path) -> None:
        calls.append(Path(folder))
        verify_checkpoint(folder)

    for name in ("brickwork.checkpoint.run_folder", "brickwork.checkpoint.folder"):
        monkeypatch.setattr(importlib.import_module(name), "verify_checkpoint", verify)
    return calls


def saved_run(root: Path) -> tuple[torch.nn.Module, Path]:
    torch.manual_seed(0)
    model = build_model("gpt-tiny", {"decoder.num_layers": 1})
    step_dir = root / "run" / "checkpoints" / "step_000002"
    save_checkpoint(step_dir, model, torch.optim.SGD(model.parameters(), lr=0.1), 2)
    (root / "run" / "config.yaml").write_text("train: {}\n")
    return model, step_dir


def test_export_checks_a_run_or_checkpoint_folder_once(tmp_path: Path, checked: list[Path]) -> None:
    model, step_dir = saved_run(tmp_path)
    for source in (tmp_path / "run", step_dir):
        checked.clear()
        out = tmp_path / f"{source.name}.safetensors"
        assert export_run(source, out) == step_dir
        assert checked == [step_dir], source
        _, weights, _ = read_export(out)
        assert torch.equal(weights["lm_head.weight"], model.lm_head.weight)


def test_load_checkpoint_checks_unless_told_the_caller_has(tmp_path: Path, checked: list[Path]) -> None:
    model, step_dir = saved_run(tmp_path)
    load_checkpoint(step_dir, model)
    assert checked == [step_dir]
    load_checkpoint(step_dir, model, verify=False)
    assert checked == [step_dir]
    shard = next(step_dir.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-8] + b"\x00" * 8)
    with pytest.raises(CorruptCheckpointError, match="does not match"):
        load_checkpoint(step_dir, model)


def test_sample_checks_a_run_or_checkpoint_folder_once(tmp_path: Path, checked: list[Path]) -> None:
    torch.manual_seed(0)
    model = build_model("gpt-tiny", {"decoder.num_layers": 1})
    step_dir = tmp_path / "run" / "checkpoints" / "step_000003"
    save_checkpoint(step_dir, model, torch.optim.SGD(model.parameters(), lr=0.1), 3)
    (tmp_path / "run" / "config.yaml").write_text("train: {seq_len: 16}\n")
    # Picking a run's newest intact checkpoint checks it; reading its weights must not check it again.
    for source in (tmp_path / "run", step_dir):
        checked.clear()
        trained = load_trained(str(source))
        assert checked == [step_dir], source
        assert trained.description == f"{source} at step 3"
        assert trained.window == 16  # the run's train.seq_len, not the spec's max_seq_len
        assert torch.equal(trained.model.lm_head.weight, model.lm_head.weight)
