"""``brickwork eval``: the validation loss (and perplexity) of a run, a checkpoint or a saved folder,
on the run's data or another, with nothing written."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from cli_runs import SMALL, check_ok, read_metrics, run_cli

from brickwork.cli import main
from brickwork.factory import from_pretrained, save_pretrained

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(workdir: Path) -> Path:
    """A finished 6-step run with checkpoints at steps 3 and 6."""
    check_ok(run_cli(["train", *SMALL, "decoder.num_layers=1", "train.out_dir=run"], workdir))
    return workdir / "run"


def listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def val_loss_at(run: Path, step: int) -> float:
    return next(r["val_loss"] for r in read_metrics(run) if r["step"] == step and "val_loss" in r)


def test_a_run_is_scored_on_its_own_validation_set_without_writing(capsys, trained: Path) -> None:
    before = listing(trained)
    assert main(["eval", str(trained)]) == 0
    captured = capsys.readouterr()
    loss_line, perplexity_line = captured.out.splitlines()
    loss = float(loss_line.removeprefix("validation loss "))
    assert loss == pytest.approx(val_loss_at(trained, 6), abs=1e-4)
    assert float(perplexity_line.removeprefix("perplexity ")) == pytest.approx(math.exp(loss), rel=1e-3)
    assert f"{trained} at step 6: task causal_lm, 2 validation batches of embedded corpus" in captured.err
    assert listing(trained) == before


def test_a_checkpoint_as_json(capsys, trained: Path) -> None:
    assert main(["eval", str(trained / "checkpoints" / "step_000003"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["task"] == "causal_lm" and result["batches"] == 2
    assert result["val_loss"] == pytest.approx(val_loss_at(trained, 3), abs=1e-4)
    assert result["perplexity"] == pytest.approx(math.exp(result["val_loss"]))


def test_a_saved_folder_on_another_data_set(capsys, trained: Path, tmp_path: Path) -> None:
    save_pretrained(from_pretrained(trained), tmp_path / "saved")
    (tmp_path / "other.txt").write_text("The cat sat on the mat and looked at the door. " * 40)
    text = f"data.path={tmp_path / 'other.txt'}"
    assert main(["eval", str(tmp_path / "saved"), text, "train.seq_len=32", "train.eval_batches=3"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("validation loss ") and len(captured.out.splitlines()) == 2
    assert "3 validation batches of" in captured.err and "other.txt" in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.txt", "saved"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["decoder.num_layers=3"], "decoder.num_layers: eval reads the model as saved; it takes data.*"),
        (["train.lr=1"], "train.lr: eval reads the model as saved"),
        (["data.path=nope.txt"], "data.path: file or folder 'nope.txt' does not exist"),
    ],
)
def test_refusals_are_one_line(capsys, trained: Path, args: list[str], expected: str) -> None:
    assert main(["eval", str(trained), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and "\n" not in err
