"""``dist: auto``: the planner picks the layout of ``brickwork train`` at launch and config.yaml
records it."""

from __future__ import annotations

import pytest
from cli_runs import SMALL, check_ok, run_cli

from brickwork.factory import load_spec


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
