"""``brickwork bench``'s training-step benchmark, on tiny GPT-2 and Llama shapes."""

from __future__ import annotations

import json

from brickwork.benchmarks import model_step
from brickwork.cli import main

TINY = model_step.TINY_CASES


def test_bench_command_writes_results(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(model_step, "CASES", TINY)
    args = ["bench", "--skip-kernels", "--layers", "1", "--batch", "2", "--seq-len", "8", "--repeats", "1"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| gpt2-tiny | brickwork | 1 | 2 x 8 | float32 |" in out and "| llama-tiny | hf |" in out
    (json_path,) = tmp_path.glob("model_step_*.json")
    rows = json.loads(json_path.read_text())["results"]
    assert [r["model"] for r in rows if r["variant"] == "hf"] == ["gpt2-tiny", "llama-tiny"]
    assert json_path.with_suffix(".md").read_text().count("| gpt2-tiny | brickwork |") == 1


def test_bench_rejects_bad_sizes(capsys):
    assert main(["bench", "--skip-kernels", "--layers", "0"]) == 2
    assert "layers: must be a positive integer, got 0" in capsys.readouterr().err
