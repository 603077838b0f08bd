"""A run's checkpoints never lose good state: pruning keeps the newest K and the best validation one
(in ``checkpoints/best``), deletes nothing before the new one is verified, never follows a symbolic
link; the loader refuses a symlinked step folder and a meta.json whose step differs from its name; a
non-finite validation loss is never saved; a full disk removes the partial folder and nothing else."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from brickwork.checkpoint import (
    UNLISTED,
    CorruptCheckpointError,
    checkpoint_dir,
    complete_checkpoints,
    latest_checkpoint,
    read_meta,
    verify_checkpoint,
)
from brickwork.checkpoint.manifest import write_manifest
from brickwork.errors import ConfigError
from brickwork.parallel import load_checkpoint
from brickwork.train.checkpoint import load_run_checkpoint, save_run_checkpoint
from brickwork.train.retention import best_checkpoint, retain


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(8, 8)


def _save(run_dir: Path, step: int, val_loss: float, keep: int = 2) -> Path:
    model = _model()
    with torch.no_grad():
        model.weight.fill_(step)  # each checkpoint's weights say which step it is
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    folder = save_run_checkpoint(run_dir, step, model, optimizer, {}, val_loss)
    retain(run_dir, folder, keep)
    return folder


def _steps(run_dir: Path) -> list[int]:
    return [step for step, _ in complete_checkpoints(run_dir)]


def _loaded_weight(folder: Path) -> float:
    model = _model()
    load_checkpoint(folder, model)
    return model.weight[0, 0].item()


def test_pruning_keeps_the_newest_two_and_the_best_one(tmp_path: Path) -> None:
    for step, loss in enumerate([3.0, 1.0, 2.0, 4.0, 5.0], start=1):
        _save(tmp_path, step, loss)
    assert _steps(tmp_path) == [4, 5]
    best = best_checkpoint(tmp_path)
    assert best == tmp_path / "checkpoints" / "best"
    assert read_meta(best)["step"] == 2 and read_meta(best)["extra"]["val_loss"] == 1.0
    verify_checkpoint(best)
    assert _loaded_weight(best) == 2.0
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "best",
        "step_000004",
        "step_000005",
    ]


def test_a_better_checkpoint_replaces_best_and_keep_zero_keeps_every_one(tmp_path: Path) -> None:
    for step, loss in enumerate([3.0, 2.0, 2.5, 0.5], start=1):
        _save(tmp_path, step, loss, keep=0)
    assert _steps(tmp_path) == [1, 2, 3, 4]
    assert read_meta(best_checkpoint(tmp_path))["step"] == 4
    assert _loaded_weight(best_checkpoint(tmp_path)) == 4.0


def test_pruning_never_follows_or_deletes_a_symlinked_step_folder(tmp_path: Path) -> None:
    precious = tmp_path / "elsewhere"
    _save(precious, 1, 1.0, keep=0)
    run = tmp_path / "run"
    _save(run, 2, 3.0)
    link = run / "checkpoints" / "step_000001"
    link.symlink_to(checkpoint_dir(precious, 1), target_is_directory=True)
    for step in (3, 4, 5):
        _save(run, step, 3.0 + step, keep=1)
    assert _steps(run) == [5] and link.is_symlink()
    verify_checkpoint(checkpoint_dir(precious, 1))
    with pytest.raises(ConfigError, match="is a symbolic link, not a checkpoint this run wrote"):
        load_run_checkpoint(link, _model(), torch.optim.SGD(_model().parameters(), lr=0.1))


def test_a_step_folder_whose_meta_json_names_another_step_is_refused(tmp_path: Path) -> None:
    _save(tmp_path, 1, 2.0)
    _save(tmp_path, 2, 1.0)
    renamed = checkpoint_dir(tmp_path, 7)
    os.rename(checkpoint_dir(tmp_path, 2), renamed)
    model = _model()
    with pytest.raises(
        CorruptCheckpointError, match=r"meta\.json says step 2, but the folder is named for step 7"
    ):
        load_run_checkpoint(renamed, model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert latest_checkpoint(tmp_path, intact=True) == (1, checkpoint_dir(tmp_path, 1))


def test_nothing_is_deleted_when_the_new_checkpoint_fails_verification(tmp_path: Path) -> None:
    _save(tmp_path, 1, 2.0, keep=1)
    model = _model()
    folder = save_run_checkpoint(tmp_path, 2, model, torch.optim.SGD(model.parameters(), lr=0.1), {}, 1.0)
    shard = next(folder.glob("*.distcp"))
    data = shard.read_bytes()
    shard.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    with pytest.raises(CorruptCheckpointError, match=shard.name):
        retain(tmp_path, folder, 1)
    assert _steps(tmp_path) == [1, 2]
    verify_checkpoint(checkpoint_dir(tmp_path, 1))


@pytest.mark.parametrize("loss", [math.nan, math.inf])
def test_a_non_finite_validation_loss_is_never_saved(tmp_path: Path, loss: float) -> None:
    model = _model()
    with pytest.raises(ValueError, match=f"its validation loss is {loss}"):
        save_run_checkpoint(tmp_path, 3, model, torch.optim.SGD(model.parameters(), lr=0.1), {}, loss)
    assert not (tmp_path / "checkpoints").exists()


DISK_FULL = textwrap.dedent(
    """
    import resource, sys
    from pathlib import Path
    import torch
    from torch import nn
    from brickwork.train.checkpoint import save_run_checkpoint
    from brickwork.train.retention import retain

    run = Path(sys.argv[1])
    model = nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    retain(run, save_run_checkpoint(run, 1, model, optimizer, {}, 2.0), 1)
    # From here no file may grow past 4 KiB: the next checkpoint's weights (16 KiB) do not fit.
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        save_run_checkpoint(run, 2, model, optimizer, {}, 1.0)
    except Exception as err:
        print(type(err).__name__ + ": " + str(err))
    """
)


@pytest.mark.timeout(120)
def test_a_full_disk_removes_the_partial_checkpoint_and_keeps_the_earlier_one(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", DISK_FULL, str(tmp_path)], capture_output=True, text=True, timeout=100
    )
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    assert line.startswith("CheckpointWriteError: could not write the checkpoint of step 2 to "), line
    assert "the disk is full or a file size limit was reached" in line, line
    assert "the partial folder was removed" in line
    assert not checkpoint_dir(tmp_path, 2).exists()
    assert _steps(tmp_path) == [1]
    verify_checkpoint(checkpoint_dir(tmp_path, 1))


@pytest.mark.parametrize("data", ["%%% not base64 %%%", None, 3])
def test_a_rewritten_trainer_state_is_named(tmp_path: Path, data: object) -> None:
    folder = _save(tmp_path, 1, 2.0)
    meta = json.loads((folder / "meta.json").read_text())
    meta["extra"]["data"] = {"generator": data}
    (folder / "meta.json").write_text(json.dumps(meta))
    write_manifest(folder, skip=UNLISTED)
    model = _model()
    with pytest.raises(
        CorruptCheckpointError, match=r"meta\.json is damaged: its trainer state cannot be read"
    ):
        load_run_checkpoint(folder, model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_a_best_loss_of_exactly_zero_is_kept(tmp_path: Path) -> None:
    for step, loss in enumerate([1.0, 0.0, 0.5], start=1):
        _save(tmp_path, step, loss)
    assert read_meta(best_checkpoint(tmp_path))["step"] == 2
