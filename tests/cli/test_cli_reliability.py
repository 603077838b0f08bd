"""Small mistakes and accidents end in one clear line: non-finite settings, files where folders belong,
an unfinished checkpoint, a missing plotter, and Ctrl-C during a checkpoint write."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch.distributed.checkpoint.filesystem as dcp_filesystem
from cli_runs import SMALL

from brickwork.cli import main
from brickwork.factory import dump_spec
from brickwork.train.metrics import MetricsLog
from brickwork.train.run_config import resolve_run

QUICK = [*SMALL, "decoder.num_layers=1", "train.sample_tokens=8"]


def error_line(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def _strict(text: str) -> list[dict]:
    def refuse(token: str) -> None:
        raise ValueError(f"non-standard JSON token {token}")

    return [json.loads(line, parse_constant=refuse) for line in text.splitlines()]


@pytest.mark.parametrize("key", ["lr", "min_lr", "grad_clip", "weight_decay"])
def test_an_infinite_setting_is_refused(capsys, tmp_path, monkeypatch, key: str) -> None:
    monkeypatch.chdir(tmp_path)
    assert f"train.{key}: must be a finite number, got inf" in error_line(
        capsys, ["train", f"train.{key}=1e400"]
    )


def test_metrics_jsonl_is_standard_json_even_for_non_finite_values(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.append({"step": 1, "loss": float("inf"), "lr": 1e-3})
    log.append({"step": 1, "val_loss": float("nan")})
    assert _strict(log.path.read_text()) == [
        {"step": 1, "loss": None, "lr": 1e-3},
        {"step": 1, "val_loss": None},
    ]


def test_config_yaml_keeps_derived_settings_unset_so_it_can_be_rerun_shorter(tmp_path: Path) -> None:
    run = resolve_run("gpt-tiny", ["train.steps=400", "train.seq_len=64"])
    assert run.train.warmup_steps == 20
    path = tmp_path / "config.yaml"
    dump_spec(run.to_dict(), path)
    again = resolve_run(str(path), ["train.steps=1", "train.seq_len=16"])
    assert again.train.warmup_steps == 0 and again.train.sample_tokens == 16  # a window past the prompt
    given = resolve_run("gpt-tiny", ["train.warmup_steps=7"])
    assert given.to_dict()["train"]["warmup_steps"] == 7


def test_rerunning_a_config_yaml_with_one_step_works_and_names_only_what_it_wrote(
    capsys, tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    dump_spec(resolve_run("gpt-tiny", ["train.steps=400"]).to_dict(), tmp_path / "config.yaml")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # no plotter installed
    assert main(["train", "config.yaml", *QUICK, "train.steps=1", "train.out_dir=short"]) == 0
    out = capsys.readouterr().out
    final = next(line for line in out.splitlines() if line.startswith("validation loss"))
    assert final.endswith("metrics and checkpoints in short") and "loss.png" not in final
    assert (
        "no loss.png: drawing it needs the matplotlib package, which is not installed: "
        "pip install 'brickwork[plot]'" in out
    )
    assert not (tmp_path / "short" / "loss.png").exists()


def test_files_where_folders_belong_and_an_unfinished_checkpoint(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("taken").write_text("not a folder")
    assert "train.out_dir: 'taken' is a file, not a run folder" in error_line(
        capsys, ["train", "train.out_dir=taken"]
    )
    Path("run/checkpoints/step_000003").mkdir(parents=True)
    Path("out.safetensors").mkdir()
    err = error_line(capsys, ["export", "run", "out.safetensors"])
    assert "OUT: 'out.safetensors' is a folder; give the name of the file to write" in err
    err = error_line(capsys, ["export", "run/checkpoints/step_000003", "weights.safetensors"])
    assert "RUN_DIR: 'run/checkpoints/step_000003' is a checkpoint whose save did not finish" in err


def test_ctrl_c_during_a_checkpoint_write_ends_as_interrupted(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(dcp_filesystem, "_write_item", interrupted)
    assert main(["train", *QUICK, "train.out_dir=cut"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "brickwork train: interrupted" and "CheckpointException" not in err
    assert not (tmp_path / "cut" / "checkpoints" / "step_000003" / ".complete").exists()
