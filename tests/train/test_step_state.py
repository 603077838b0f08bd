"""A run's checkpoint holds the train step's own state (the fp16 loss scaler's), restores it on load,
loads a checkpoint saved before it was kept with a fresh scaler, and names a damaged one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from brickwork.checkpoint import META_FILE, UNLISTED, CorruptCheckpointError
from brickwork.checkpoint.manifest import write_manifest
from brickwork.train.checkpoint import load_run_checkpoint, save_run_checkpoint
from brickwork.train.precision import LossScaler
from brickwork.train.step import TrainStep


def _sum_task(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return model(batch["x"]).sum(), torch.tensor(batch["x"].shape[0])


def _fp16_step() -> TrainStep:
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    return TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1), _sum_task, precision="fp16")


def _save(run_dir: Path, step: TrainStep, keep_state: bool = True) -> Path:
    state = step.state_dict() if keep_state else None
    return save_run_checkpoint(run_dir, 1, step.model, step.optimizer, {}, 1.0, step_state=state)


def _edit_step_state(folder: Path, value: object) -> None:
    meta = json.loads((folder / META_FILE).read_text())
    meta["extra"]["train_step"] = value
    (folder / META_FILE).write_text(json.dumps(meta))
    write_manifest(folder, skip=UNLISTED)


def test_the_loss_scaler_state_round_trips_through_a_checkpoint(tmp_path: Path) -> None:
    saved = _fp16_step()
    for overflowed in (True, True, False, True):
        saved.precision.scaler.update(overflowed)
    folder = _save(tmp_path, saved)
    loaded = _fp16_step()
    load_run_checkpoint(folder, loaded.model, loaded.optimizer, loaded)
    assert (
        loaded.state_dict()
        == saved.state_dict()
        == {"loss_scaler": {"scale": 8192.0, "clean_steps": 0, "overflows_in_a_row": 1}}
    )


def test_a_checkpoint_saved_without_the_step_state_loads_with_a_fresh_scaler(tmp_path: Path) -> None:
    saved = _fp16_step()
    saved.precision.scaler.update(True)
    folder = _save(tmp_path, saved, keep_state=False)
    assert "train_step" not in json.loads((folder / META_FILE).read_text())["extra"]
    loaded = _fp16_step()
    load_run_checkpoint(folder, loaded.model, loaded.optimizer, loaded)
    assert loaded.precision.scaler.scale == 2.0**16


@pytest.mark.parametrize(
    "value",
    [
        "not an object",
        {"loss_scaler": {"scale": 0.0, "clean_steps": 0, "overflows_in_a_row": 0}},
        {"loss_scaler": {"scale": 1024.0, "clean_steps": -1, "overflows_in_a_row": 0}},
        {"loss_scaler": {"scale": 1024.0, "clean_steps": 0}},
    ],
)
def test_a_damaged_step_state_is_named(tmp_path: Path, value: object) -> None:
    folder = _save(tmp_path, _fp16_step())
    _edit_step_state(folder, value)
    step = _fp16_step()
    with pytest.raises(CorruptCheckpointError, match="its trainer state cannot be read") as raised:
        load_run_checkpoint(folder, step.model, step.optimizer, step)
    assert str(folder / META_FILE) in str(raised.value)


def test_a_step_at_another_precision_keeps_no_state_and_ignores_a_scalers() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1), _sum_task)
    assert step.state_dict() == {}
    step.load_state_dict({"loss_scaler": LossScaler(torch.device("cpu"), distributed=False).state_dict()})
    assert step.precision.scaler is None
