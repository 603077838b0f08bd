"""``brickwork train`` under torchrun on CPU: the same curve as one process, rank-0 output, resume."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cli_runs import SMALL, check_ok, curve, run_cli

from brickwork.factory import load_spec

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


@pytest.fixture(scope="module")
def single(workdir: Path) -> Path:
    check_ok(run_cli(["train", *SMALL, "train.out_dir=single"], workdir))
    return workdir / "single"


def assert_same_curve(run_dir: Path, reference: Path) -> None:
    got, expected = curve(run_dir), curve(reference)
    assert [r[0] for r in got] == [r[0] for r in expected]
    for a, b in zip(got, expected):
        for x, y in zip(a[1:], b[1:]):
            assert (x is None) == (y is None)
            if x is not None:
                assert x == pytest.approx(y, rel=1e-5, abs=1e-6)


@pytest.mark.timeout(300)
def test_data_parallel_run_matches_one_process(single, workdir):
    out = check_ok(
        run_cli(["train", *SMALL, "train.out_dir=dp2", "dist.data_parallel_size=2"], workdir, nproc=2)
    )
    assert out.count("run folder dp2") == 1 and out.count("step 6/6") == 1
    assert "2 processes (cpu): dp=2 tp=1" in out
    assert load_spec(workdir / "dp2" / "config.yaml")["dist"]["data_parallel_size"] == 2
    assert_same_curve(workdir / "dp2", single)


@pytest.mark.timeout(300)
def test_tensor_parallel_run_matches_one_process_and_resumes(single, workdir):
    out = check_ok(
        run_cli(["train", *SMALL, "train.out_dir=tp2", "dist.tensor_parallel_size=2"], workdir, nproc=2)
    )
    assert "2 processes (cpu): dp=1 tp=2" in out
    assert_same_curve(workdir / "tp2", single)
    folder = workdir / "tp2" / "checkpoints" / "step_000006"
    assert {p.name for p in folder.iterdir()} == {
        ".complete",
        "model.safetensors",
        "trainer_rank0.pt",
        "trainer_rank1.pt",
    }

    cut = workdir / "tp2_cut"
    shutil.copytree(workdir / "tp2", cut)
    shutil.rmtree(cut / "checkpoints" / "step_000006")
    out = check_ok(run_cli(["train", "--resume", str(cut)], workdir, nproc=2))
    assert out.count(f"resuming {cut} from step 3 of 6") == 1
    assert curve(cut) == curve(workdir / "tp2")


@pytest.mark.timeout(300)
def test_pipeline_parallel_run_matches_one_process(single, workdir):
    out = check_ok(
        run_cli(["train", *SMALL, "train.out_dir=pp2", "dist.pipeline_parallel_size=2"], workdir, nproc=2)
    )
    assert "2 processes (cpu): dp=1 tp=1 pp=2" in out
    assert_same_curve(workdir / "pp2", single)
