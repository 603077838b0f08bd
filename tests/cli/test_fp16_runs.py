"""fp16 runs of ``brickwork train``: a resumed run goes on with the loss scale the uninterrupted one had,
so it writes the same records, and a run whose steps keep overflowing stops with an error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cli_runs import SMALL, read_metrics

from brickwork.cli import main

# lr=0.3 overflows the first steps' fp16 gradients: the loss scale is 16384 at the step-4 checkpoint.
FP16 = [
    *SMALL,
    "decoder.num_layers=1",
    "train.sample_tokens=0",
    "train.precision=fp16",
    "train.lr=0.3",
    "train.steps=8",
    "train.checkpoint_interval=4",
]


def _records(run_dir: Path) -> list[dict]:
    """Every record without its timings (tokens_per_s, and the mfu counted from it)."""
    return [{k: v for k, v in r.items() if k not in ("tokens_per_s", "mfu")} for r in read_metrics(run_dir)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_resumed_fp16_run_goes_on_with_the_loss_scale_it_had(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["train", *FP16, "train.out_dir=whole"]) == 0
    uninterrupted = _records(tmp_path / "whole")
    scales = {r["step"]: r["loss_scale"] for r in uninterrupted if "loss_scale" in r}
    assert scales[4] < 2**16  # overflows before the checkpoint: its scale is not the initial one
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")
    shutil.rmtree(tmp_path / "cut" / "checkpoints" / "step_000008")
    assert main(["train", "--resume", "cut"]) == 0
    assert _records(tmp_path / "cut") == uninterrupted


def test_fp16_steps_that_keep_overflowing_end_the_run_with_an_error(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = [*FP16, "train.lr=5", "train.steps=20", "train.out_dir=run"]
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    assert err.startswith("brickwork train: error: the last 10 steps (to step 11) all overflowed in fp16")
    assert "lower train.lr (now 5.0), or raise train.max_skipped_steps (now 10)" in err
    records = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert records[-1]["step"] == 11 and all(r.get("skipped") for r in records[1:])
