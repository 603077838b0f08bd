"""MFU: nanoGPT's FLOPs estimate written out by hand, over a device's data-sheet peak, in the run log."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from brickwork.cli import main
from brickwork.factory import get_preset
from brickwork.parallel.planner.devices import DEVICE_PRESETS
from brickwork.train.mfu import run_utilization
from brickwork.train.tasks import TASKS

CPU = torch.device("cpu")


def nanogpt_flops_per_token(layers: int, dim: int, hidden: int, vocab: int, seq_len: int) -> float:
    """nanoGPT's ``6N + 12·L·H·Q·T``, N the matmul weights: per layer q, k, v and the output
    projection (4·d²) and the MLP's two (2·d·hidden), plus the LM head (d·V)."""
    matmul_weights = layers * (4 * dim * dim + 2 * dim * hidden) + dim * vocab
    return 6 * matmul_weights + 12 * layers * dim * seq_len


def known_device(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Make this process's device look like the preset ``name``."""
    monkeypatch.setattr("brickwork.train.mfu.running_preset", lambda device: DEVICE_PRESETS[name])


@pytest.mark.parametrize(("precision", "peak"), [("bf16", 312e12), ("bf16-mixed", 312e12), ("fp32", 19.5e12)])
def test_mfu_is_the_model_flops_rate_over_the_peak_of_every_device(
    monkeypatch: pytest.MonkeyPatch, precision: str, peak: float
) -> None:
    known_device(monkeypatch, "A100-80GB")
    spec = get_preset("gpt-tiny")  # 4 layers of 128, MLP 512, 256 byte ids
    utilization = run_utilization(spec, seq_len=64, precision=precision, device=CPU, devices=8)
    expected = nanogpt_flops_per_token(4, 128, 512, 256, 64) * 1e6 / (8 * peak)
    assert utilization.unknown is None
    assert utilization.mfu(1e6) == pytest.approx(expected, rel=1e-12)


def test_mfu_is_unknown_on_a_cpu_and_for_models_the_planner_does_not_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    on_cpu = run_utilization(get_preset("gpt-tiny"), seq_len=64, precision="fp32", device=CPU, devices=1)
    assert on_cpu.mfu(1e6) is None and on_cpu.unknown.startswith("no peak FLOP/s is known for cpu")
    known_device(monkeypatch, "H100-80GB")
    reversible = get_preset("gpt-tiny")
    reversible["decoder"]["reversible"] = True
    uncounted = run_utilization(reversible, seq_len=64, precision="bf16", device=CPU, devices=1)
    assert uncounted.mfu(1e6) is None
    assert uncounted.unknown == "no FLOP count: the planner does not cover reversible layers yet"
    encoder = run_utilization(get_preset("bert-base"), seq_len=64, precision="bf16", device=CPU, devices=1)
    assert encoder.unknown is None and encoder.mfu(1e6) > 0  # every model kind is planned


def test_an_encoder_decoders_mfu_counts_the_lengths_its_task_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """T5 small's span corruption reads 480 source and 64 target tokens from a window of 512; its
    FLOPs per window token: each stack's weights over its own tokens (the decoder's cross-attention
    keys and values over the source's), attention's squares at their lengths, the tied head over the
    target, written out here."""
    known_device(monkeypatch, "H100-80GB")
    h, f, a, d, vocab, layers, window = 512, 2048, 8, 64, 32128, 6, 512
    source, target = TASKS["seq2seq"].model_lengths(window)
    assert (source, target) == (480, 64)
    encoder = 2 * (4 * h * h + 2 * h * f) * source + 4 * source * source * a * d
    decoder = 2 * (6 * h * h + 2 * h * f) * target + 2 * 2 * h * h * source
    decoder += 4 * target * target * a * d + 4 * target * source * a * d
    per_window_token = 3 * (layers * (encoder + decoder) + 2 * h * vocab * target) / window
    spec = get_preset("t5-small")
    utilization = run_utilization(spec, window, "bf16", CPU, 1, (source, target))
    assert utilization.flops_per_token == pytest.approx(per_window_token, rel=1e-12)


RUN = [
    "train",
    "gpt-tiny",
    "dim_model=64",
    "decoder.num_layers=2",
    "decoder.block.feedforward.hidden_dim=256",
    "train.steps=4",
    "train.batch_size=4",
    "train.seq_len=32",
    "train.eval_interval=2",
    "train.eval_batches=1",
    "train.checkpoint_interval=4",
    "train.sample_tokens=0",
    "train.out_dir=run",
]


def train_records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if "loss" in record]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_run_on_a_known_device_logs_mfu_in_every_record_and_the_progress_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    known_device(monkeypatch, "H100-80GB")
    assert main(RUN) == 0
    out = capsys.readouterr().out
    records = train_records(tmp_path / "run")
    assert len(records) == 4
    # fp32 on one H100: its 67 TFLOP/s fp32 peak; the rate is the global batch's 4 x 32 tokens a step.
    per_token = nanogpt_flops_per_token(2, 64, 256, 256, 32)
    for record in records:
        assert record["mfu"] == pytest.approx(per_token * record["tokens_per_s"] / 67e12, rel=1e-3)
    assert re.search(r"step 2/4  train loss .* tok/s  MFU \d+\.\d%  ETA", out)
    assert "mfu is null" not in out


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_cpu_run_writes_mfu_as_null_and_says_why_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(RUN) == 0
    out = capsys.readouterr().out
    assert [record["mfu"] for record in train_records(tmp_path / "run")] == [None] * 4
    assert out.count("mfu is null in metrics.jsonl: no peak FLOP/s is known for cpu") == 1
    assert "MFU" not in out
