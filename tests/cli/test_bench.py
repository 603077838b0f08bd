"""``brickwork bench``'s training-step benchmark, on tiny GPT-2 and Llama shapes."""

from __future__ import annotations

import json

from brickwork.benchmarks import model_step
from brickwork.cli import main


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


TINY = (model_step.StepCase("gpt2-tiny", tiny_gpt2), model_step.StepCase("llama-tiny", tiny_llama))


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
    assert "--layers: must be a positive integer, got 0" in capsys.readouterr().err
