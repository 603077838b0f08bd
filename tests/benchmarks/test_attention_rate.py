"""benchmarks/attention_rate.py: its FLOP count is the planner's, and a small CPU run writes every case."""

from __future__ import annotations

import json

import pytest

from benchmarks.attention_rate import causal_forward_flops, main
from brickwork.factory import get_preset
from brickwork.parallel.planner.flops import layer_flops
from brickwork.parallel.planner.lengths import Lengths
from brickwork.parallel.planner.model_facts import model_facts


def test_the_count_is_the_planners_for_a_fused_causal_kernel() -> None:
    """Per token and layer the planner counts half of 4·s·a·d for causal SDPA; a batch of b sequences
    of s tokens is b·s tokens of it."""
    shape = model_facts(get_preset("llama3-8b")).layers[0]
    assert shape.sdpa and shape.causal
    length, batch = 8192, 2
    per_token = layer_flops(shape, Lengths.one(length)).attention_executed
    assert causal_forward_flops(batch, shape.num_heads, length, shape.dim_head) == pytest.approx(
        per_token * batch * length, rel=1e-12
    )


def test_a_cpu_run_writes_every_case(tmp_path, capsys) -> None:
    assert (
        main(["--lengths", "64", "128", "--head-dims", "16", "32", "--width", "64", "--out", str(tmp_path)])
        == 0
    )
    (written,) = tmp_path.glob("attention_rate_*.json")
    result = json.loads(written.read_text())
    assert result["preset"] is None  # a CPU has none, so no fraction of peak is claimed
    cases = {(r["length"], r["dim_head"]) for r in result["rows"]}
    assert cases == {(64, 16), (128, 16), (64, 32), (128, 32)}
    for row in result["rows"]:
        assert row["forward_ms"] > 0 and row["backward_ms"] > 0 and "fraction_of_peak" not in row
        assert row["heads"] * row["dim_head"] == 64
    assert "s=   128 d= 32" in capsys.readouterr().out


def test_a_width_that_is_not_whole_heads_is_refused(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--width", "100", "--head-dims", "64", "--out", str(tmp_path)])
    assert stopped.value.code == 2
    assert "--width 100 is not a whole number of heads of size [64]" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before anything is written
