"""``brickwork train --resume RUN key=value``: settings that keep the model, the data and the batch
may change, each printed and recorded; any other key is refused, naming it and why, and the run
folder stays as it was."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from cli_runs import SMALL, check_ok, read_metrics, run_cli

from brickwork.cli import main
from brickwork.factory import load_spec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(workdir: Path) -> Path:
    """A finished 6-step run with checkpoints at steps 3 and 6."""
    check_ok(run_cli(["train", *SMALL, "decoder.num_layers=1", "train.out_dir=base"], workdir))
    return workdir / "base"


def listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_learning_rate_steps_and_intervals_change_on_resume(trained: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    args = ["train", "--resume", str(run), "train.lr=1e-3", "train.min_lr=1e-4", "train.steps=8"]
    out = check_ok(run_cli([*args, "train.eval_interval=4", "train.log_to=[jsonl]"], tmp_path))
    assert "resuming" in out and "from step 6 of 8" in out
    said = [line for line in out.splitlines() if line.startswith("config.yaml changed")]
    assert said == [
        "config.yaml changed from step 6: train.eval_interval 3 -> 4, train.log_to 'jsonl' -> ['jsonl'], "
        "train.lr 0.003 -> 0.001, train.min_lr 0.0003 -> 0.0001, train.steps 6 -> 8 "
        "(recorded in config_changes.jsonl)"
    ]
    train = load_spec(run / "config.yaml")["train"]
    assert (train["lr"], train["min_lr"], train["steps"], train["eval_interval"]) == (0.001, 0.0001, 8, 4)
    (record,) = [json.loads(line) for line in (run / "config_changes.jsonl").read_text().splitlines()]
    assert record["step"] == 6 and record["changes"]["train.lr"] == [0.003, 0.001]
    resumed = [r for r in read_metrics(run) if r["step"] > 6]
    assert [(r["step"], "lr" in r) for r in resumed] == [(7, True), (8, True), (8, False)]
    assert all(1e-4 <= r["lr"] <= 1e-3 for r in resumed[:2])


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ("decoder.num_layers=3", "the checkpoint holds the weights of the model config.yaml describes"),
        ("dim_model=64", "the checkpoint holds the weights of the model config.yaml describes"),
        ("data.path=other.txt", "the run goes on with the data it started with"),
        ("train.batch_size=2", "what the optimizer state and the data order in the checkpoint mean"),
        ("train.seq_len=16", "what the optimizer state and the data order in the checkpoint mean"),
    ],
)
def test_model_data_and_batch_keys_are_refused(capsys, trained: Path, override: str, reason: str) -> None:
    before = listing(trained)
    assert main(["train", "--resume", str(trained), override]) == 2
    err = capsys.readouterr().err.strip()
    key = override.split("=")[0]
    assert re.match(rf"brickwork train: error: {re.escape(key)}: cannot change on --resume: ", err)
    assert reason in err and "train.lr" in err and "\n" not in err
    assert listing(trained) == before
