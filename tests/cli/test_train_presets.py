"""``brickwork train`` trains every preset, shrunk, on its embedded data: the byte corpus (causal LM,
BERT masking, T5 span corruption) and the generated image set (ViT)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from cli_runs import read_metrics

from brickwork.cli import main

pytestmark = pytest.mark.slow


def shrunk(stack: str, heads: int = 2) -> list[str]:
    return [
        f"{stack}.num_layers=1",
        f"{stack}.block.attention.num_heads={heads}",
        f"{stack}.block.feedforward.hidden_dim=64",
    ]


PRESETS = {
    "gpt2": ["dim_model=32", *shrunk("decoder")],
    "gpt-tiny": ["dim_model=32", *shrunk("decoder")],
    "llama": ["dim_model=32", *shrunk("decoder", 4), "decoder.block.attention.num_kv_heads=2"],
    "bert-base": ["dim_model=32", *shrunk("encoder")],
    "t5-small": ["dim_model=32", *shrunk("encoder"), *shrunk("decoder")],
    "vit": ["dim_model=32", *shrunk("encoder"), "image_size=16", "patch_size=4"],
}
TASKS = {
    "gpt2": "causal_lm",
    "gpt-tiny": "causal_lm",
    "llama": "causal_lm",
    "bert-base": "masked_lm",
    "t5-small": "seq2seq",
    "vit": "image_classification",
}
RUN = [
    "train.steps=8",
    "train.batch_size=8",
    "train.seq_len=32",
    "train.lr=1e-2",
    "train.schedule=constant",
    "train.warmup_steps=0",
    "train.eval_interval=8",
    "train.eval_batches=2",
    "train.checkpoint_interval=8",
    "train.sample_tokens=4",
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("preset", list(PRESETS))
def test_every_preset_trains_on_its_embedded_data(preset: str, tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    accumulate = ["train.grad_accum_steps=2"] if preset in ("bert-base", "vit") else []
    assert main(["train", preset, *PRESETS[preset], *RUN, *accumulate, "train.out_dir=run"]) == 0
    out = capsys.readouterr().out
    assert f"task {TASKS[preset]}" in out
    records = read_metrics(tmp_path / "run")
    val = [r["val_loss"] for r in records if "val_loss" in r]
    assert len(val) == 2 and all(math.isfinite(v) for v in val)
    assert val[1] < val[0], f"{preset}: validation loss {val[0]:.3f} -> {val[1]:.3f}"
    assert (tmp_path / "run" / "checkpoints" / "step_000008" / ".complete").is_file()


@pytest.mark.timeout(240)
def test_moe_runs_log_the_aux_loss_and_expert_counts(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    moe = "{name: moe, num_experts: 4, top_k: 1, hidden_dim: 32, aux_loss_weight: 0.05}"
    moe = f"decoder.block.feedforward={moe}"
    assert main(["train", "gpt-tiny", *PRESETS["gpt-tiny"], moe, *RUN, "train.out_dir=run"]) == 0
    records = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert len(records) == 8
    for record in records:
        (counts,) = record["expert_counts"]  # one MoE layer
        assert len(counts) == 4 and sum(counts) == 8 * 32  # every token of the batch routed once
        # The weighted Switch loss: at least the weight, which it equals when routing is balanced.
        assert 0.05 * (1 - 1e-6) <= record["aux_loss"] <= 0.05 * 4
