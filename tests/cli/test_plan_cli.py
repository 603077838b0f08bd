"""``brickwork plan`` as a user runs it: presets and overrides as train takes them, the batch it plans
said out loud, nothing written unless asked, and every row's gap to the best explained."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from brickwork.cli import main
from brickwork.factory import get_preset
from brickwork.parallel import ParallelConfig, plan

TERM = re.compile(
    r"(compute|recompute|bubble|TP comm|CP comm|EP comm|PP sends|DP comm|offload|stage imbalance) [+-]"
)


def _rows(printed: str) -> list[list[str]]:
    """The table's rows below its header, as cells."""
    lines = [line for line in printed.splitlines() if re.match(r"^\| \d+ \|", line)]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_plan_takes_a_llama3_preset_and_overrides_and_writes_only_with_o(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["--devices", "8xH100-80GB", "--global-batch", "64", "--seq-len", "8192", "--top", "12"]
    assert main(["plan", "llama3-8b", *args]) == 0
    printed = capsys.readouterr().out
    assert "assuming" not in printed and list(tmp_path.iterdir()) == []
    assert "-o FILE writes its dist dict" in printed
    rows = _rows(printed)
    assert rows[0][-1] == "best" and len(rows) == 12
    for row in rows[1:]:
        why = row[-1]
        # A runner-up names what it loses on: a tie its memory, a gap the terms of the step.
        assert why.startswith("tie on step time; ") or (
            re.match(r"\+\d+\.\d%: ", why) and TERM.search(why)
        ), why
        assert "0.0% slower" not in why
    assert float(rows[0][3]) >= 0  # headroom: the device's memory left over (the best may fill it)

    assert main(["plan", "llama3-8b", "decoder.num_layers=2", *args, "-o", "dist.yaml"]) == 0
    small = capsys.readouterr().out
    assert _rows(small)[0][2] != rows[0][2]  # the override reached the model the planner priced
    dist = yaml.safe_load((tmp_path / "dist.yaml").read_text())["dist"]
    assert ParallelConfig.from_dict(dist, world_size=8).world_size == 8
    assert "wrote dist.yaml" in small


def test_plan_says_the_batch_and_length_it_assumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "gpt2", "train.batch_size=32", "--devices", "8xA100-80GB", "--top", "1"]) == 0
    printed = capsys.readouterr().out
    assert "assuming --global-batch 32 (the spec's train.batch_size)" in printed
    assert "assuming --seq-len 128 (the spec's train.seq_len)" in printed
    assert "for 32 x 128 tokens per step" in printed and not (tmp_path / "dist.yaml").exists()


def test_plan_reports_a_bad_override_at_its_key(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "llama", "decoder.block.attention.num_heads=7", "--devices", "8xH100-80GB"])
    assert code == 2
    assert "decoder.block.attention" in capsys.readouterr().err


def test_plan_prices_an_encoder_decoder_at_the_lengths_its_task_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """T5's span corruption cuts 16 spans of 3 from a window of 512: 480 tokens for the encoder, 64
    (each span behind its sentinel) for the decoder."""
    monkeypatch.chdir(tmp_path)
    args = ["--devices", "8xH100-80GB", "--global-batch", "64", "--seq-len", "512", "--top", "1"]
    assert main(["plan", "t5-small", *args]) == 0
    printed = capsys.readouterr().out
    assert "its seq2seq task puts 480 source and 64 target tokens a row" in printed
    best = plan(get_preset("t5-small"), "8xH100-80GB", global_batch=64, seq_len=480, target_len=64)[0]
    assert _rows(printed)[0][1] == best.name and _rows(printed)[0][5] == f"{best.tokens_per_s:,.0f}"
