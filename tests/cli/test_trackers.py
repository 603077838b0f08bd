"""``train.log_to``: metrics.jsonl always, plus TensorBoard and W&B (offline here) from one list; a
resumed run goes on with the same W&B run."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runs import SMALL, check_ok, read_metrics, run_cli

from brickwork.cli import main

pytestmark = pytest.mark.slow


def test_tensorboard_and_wandb_take_every_record(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("wandb")
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    args = ["train", *SMALL, "decoder.num_layers=1", "train.out_dir=run", "train.log_to=[tensorboard,wandb]"]
    check_ok(run_cli(args, tmp_path))
    run = tmp_path / "run"
    val = [(r["step"], r["val_loss"]) for r in read_metrics(run) if "val_loss" in r]
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    logged = [(e.step, e.value) for e in events.Scalars("val_loss")]
    assert [s for s, _ in logged] == [s for s, _ in val] == [0, 3, 6]
    assert [v for _, v in logged] == pytest.approx([v for _, v in val], rel=1e-6)
    (first,) = (run / "wandb").glob("offline-run-*")
    history = next(first.glob("run-*.wandb")).read_bytes()
    assert b"val_loss" in history and b"tokens_per_s" in history

    check_ok(run_cli(["train", "--resume", "run", "train.steps=8"], tmp_path))
    ids = {folder.name.rsplit("-", 1)[1] for folder in (run / "wandb").glob("offline-run-*")}
    assert ids == {first.name.rsplit("-", 1)[1]}  # the same W&B run, resumed


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("[jsonl,mlflow]", "train.log_to: unknown value 'mlflow'; allowed: jsonl, tensorboard, wandb"),
        ("[wandb,wandb]", "train.log_to: names a tracker twice, got ['wandb', 'wandb']"),
    ],
)
def test_unknown_or_repeated_trackers_are_refused(capsys, tmp_path, monkeypatch, value, expected) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["train", f"train.log_to={value}"]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and "\n" not in err
    assert list(tmp_path.iterdir()) == []
