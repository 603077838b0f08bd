"""``dist: auto``: the planner picks the layout of ``brickwork train`` at launch and config.yaml
records it."""

from __future__ import annotations

import pytest
from cli_runs import SMALL, check_ok, run_cli

from brickwork.factory import get_preset, load_spec


@pytest.mark.slow
@pytest.mark.distributed
def test_dist_auto_picks_a_layout_for_the_launched_world(tmp_path) -> None:
    out = tmp_path / "run"
    stdout = check_ok(run_cli(["train", "dist=auto", *SMALL, f"train.out_dir={out}"], tmp_path, nproc=2))
    assert "dist: auto picked tp" in stdout and "| best |" in stdout
    dist = load_spec(out / "config.yaml")["dist"]
    sizes = ("data_parallel_size", "tensor_parallel_size", "pipeline_parallel_size", "context_parallel_size")
    assert dist["data_parallel_size"] * dist["tensor_parallel_size"] * dist["pipeline_parallel_size"] == 2
    assert all(key in dist for key in sizes) and "auto" not in dist


def test_dist_auto_refuses_a_size_given_beside_it(tmp_path) -> None:
    result = run_cli(["train", "dist.auto=true", "dist.tensor_parallel_size=2", *SMALL], tmp_path)
    assert result.returncode == 2
    assert "dist.auto picks ['tensor_parallel_size'] itself" in result.stderr


@pytest.mark.parametrize("preset", ["H100-80GB", None], ids=["H100", "cpu"])
def test_dist_auto_plans_fp8_at_the_float8_rate_where_the_device_has_one(monkeypatch, preset) -> None:
    """On a device whose preset has float8 matmuls the planner prices fp8 as such; where fp8 is
    emulated (a CPU) it prices bf16-mixed, whose weights, states and activations fp8 keeps."""
    pytest.importorskip("torchao")
    from brickwork.parallel.planner.devices import DEVICE_PRESETS
    from brickwork.train import auto_dist
    from brickwork.train.config import TrainConfig

    seen, planner = {}, auto_dist.plan

    def plan(spec, cluster, **options):
        seen.update(options)
        return planner(spec, cluster, **options)

    if preset is not None:
        monkeypatch.setattr(auto_dist, "local_device", lambda world, per_node: DEVICE_PRESETS[preset])
    monkeypatch.setattr(auto_dist, "plan", plan)
    train = TrainConfig(precision="fp8", batch_size=4, seq_len=32)
    auto_dist.choose_layout(get_preset("gpt-tiny"), "auto", train)
    assert seen["precision"] == ("fp8" if preset else "bf16-mixed")


def test_dist_auto_plans_an_encoder_decoder_at_the_lengths_its_task_reads(monkeypatch) -> None:
    """T5's span corruption cuts 3 spans of 3 from a window of 64: 58 tokens for the encoder, 12 for
    the decoder, which the planner prices instead of 64 for both."""
    from brickwork.train import auto_dist
    from brickwork.train.run import run_task, with_auto_dist
    from brickwork.train.run_config import resolve_run

    seen, planner = {}, auto_dist.plan

    def plan(spec, cluster, **options):
        seen.update(options)
        return planner(spec, cluster, **options)

    monkeypatch.setattr(auto_dist, "plan", plan)
    sizes = ["train.seq_len=64", "train.batch_size=4", "encoder.num_layers=1", "decoder.num_layers=1"]
    config = resolve_run("t5-small", ["dist=auto", *sizes])
    chosen = with_auto_dist(config, run_task(config))
    assert (seen["seq_len"], seen["target_len"]) == (58, 12)
    assert chosen.dist["data_parallel_size"] == 1 and "auto" not in chosen.dist
