"""``brickwork bench``'s training-step benchmark, on tiny GPT-2 and Llama shapes."""

from __future__ import annotations

import json

import pytest

from brickwork.cli import main
from brickwork.train import step_benchmark


def tiny_gpt2(layers: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=32, n_head=4, n_positions=64, vocab_size=97))


def tiny_llama(layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=layers, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=97, max_position_embeddings=64,
    )  # fmt: skip
    return LlamaForCausalLM(config)


TINY = (step_benchmark.StepCase("gpt2-tiny", tiny_gpt2), step_benchmark.StepCase("llama-tiny", tiny_llama))


@pytest.mark.parametrize("case", TINY, ids=lambda c: c.name)
def test_step_benchmark_times_the_same_model_both_ways(case):
    row = step_benchmark.run_case(case, layers=2, batch=2, seq=16, repeats=2, compile_too=False)
    # from_hf gives the same function: the logits agree before anything is timed.
    assert row["max_logit_diff"] < 1e-4
    assert row["brickwork_ms"] > 0 and row["hf_ms"] > 0
    assert row["ratio"] == pytest.approx(row["brickwork_ms"] / row["hf_ms"])
    assert row["dtype"] == "float32" and row["layers"] == 2


def test_bench_command_writes_results(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(step_benchmark, "CASES", TINY)
    args = ["bench", "--skip-kernels", "--layers", "1", "--batch", "2", "--seq-len", "8", "--repeats", "1"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| gpt2-tiny | 1 | 2 x 8 | cpu | float32 |" in out and "| llama-tiny |" in out
    (json_path,) = tmp_path.glob("model_step_*.json")
    rows = json.loads(json_path.read_text())["results"]
    assert [r["model"] for r in rows] == ["gpt2-tiny", "llama-tiny"]
    assert json_path.with_suffix(".md").read_text().count("| gpt2-tiny |") == 1


def test_bench_rejects_bad_sizes(capsys):
    assert main(["bench", "--skip-kernels", "--layers", "0"]) == 2
    assert "--layers: must be a positive integer, got 0" in capsys.readouterr().err
