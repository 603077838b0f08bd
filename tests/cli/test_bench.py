"""``brickwork bench``'s training-step benchmark, on tiny GPT-2 and Llama shapes."""

from __future__ import annotations

import json

import pytest

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


def test_bench_takes_the_kernel_selection_and_every_ratio_reads_as_faster(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(model_step, "CASES", TINY[:1])
    sizes = ["--layers", "1", "--batch", "2", "--seq-len", "8", "--repeats", "1"]
    kernels = ["--kernels", "rms_norm", "--widths", "64", "--rows", "8", "--modes", "forward"]
    args = ["bench", *kernels, "--providers", "brickwork", "torch", "--dtypes", "float32", *sizes]
    assert main([*args, "--out", str(tmp_path)]) == 0
    (kernel_json,) = [p for p in tmp_path.glob("*.json") if not p.name.startswith("model_step")]
    rows = json.loads(kernel_json.read_text())["results"]
    assert {(r["kernel"], r["width"], r["mode"]) for r in rows} == {("rms_norm", 64, "forward")}
    kernel_head = kernel_json.with_suffix(".md").read_text().splitlines()[-3]
    assert "| × faster than torch (higher is better) |" in kernel_head
    model_lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    table = [[cell.strip() for cell in line.strip("|").split("|")] for line in model_lines]
    column = table[0].index("× faster than HF (higher is better)")
    speedup = {row[1]: float(row[column]) for row in table[1:]}
    # The printed wall times are rounded to 0.1 ms, too coarse for a tiny step's ratio, so the
    # ratio is checked against the unrounded times the JSON keeps; the table prints two decimals.
    (model_json,) = tmp_path.glob("model_step_*.json")
    wall = {r["variant"]: r["wall_ms"] for r in json.loads(model_json.read_text())["results"]}
    assert speedup["brickwork"] == pytest.approx(wall["hf"] / wall["brickwork"], abs=0.006)
    assert speedup["hf"] == 1.0


def test_bench_refuses_a_bad_width_in_one_line(capsys):
    assert main(["bench", "--widths", "0", "--skip-models"]) == 2
    assert "--widths: must be positive integers, got 0" in capsys.readouterr().err
