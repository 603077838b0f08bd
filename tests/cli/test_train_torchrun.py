"""``brickwork train`` under torchrun on CPU: the same curve as one process, rank-0 output, resume under
the same layout and under another one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from cli_runs import SMALL, check_ok, curve, run_cli
from safetensors.torch import load_file

from brickwork.factory import load_spec
from brickwork.parallel import export

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


@pytest.fixture(scope="module")
def dp2(workdir: Path) -> tuple[Path, str]:
    args = ["train", *SMALL, "train.out_dir=dp2", "dist.data_parallel_size=2"]
    return workdir / "dp2", check_ok(run_cli(args, workdir, nproc=2))


@pytest.mark.timeout(300)
def test_data_parallel_run_matches_one_process(single, dp2):
    run_dir, out = dp2
    assert out.count("run folder dp2") == 1 and out.count("step 6/6") == 1
    assert "2 processes (cpu): dp=2 tp=1" in out
    assert load_spec(run_dir / "config.yaml")["dist"]["data_parallel_size"] == 2
    assert_same_curve(run_dir, single)


@pytest.mark.timeout(300)
def test_tensor_parallel_run_matches_one_process_and_resumes(single, workdir):
    out = check_ok(
        run_cli(["train", *SMALL, "train.out_dir=tp2", "dist.tensor_parallel_size=2"], workdir, nproc=2)
    )
    assert "2 processes (cpu): dp=1 tp=2" in out
    assert_same_curve(workdir / "tp2", single)
    # Each rank writes its own shard file and RNG state; rank 0 the metadata, checksums and marker.
    folder = workdir / "tp2" / "checkpoints" / "step_000006"
    assert {p.name for p in folder.iterdir()} == {
        ".complete",
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "manifest.json",
        "meta.json",
        "rng",
    }
    assert {p.name for p in (folder / "rng").iterdir()} == {"rank0.pt", "rank1.pt"}

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


def cut_at_step_3(run_dir: Path, name: str) -> Path:
    """A copy of a finished run as if it had died while saving step 6."""
    cut = run_dir.parent / name
    shutil.copytree(run_dir, cut)
    (cut / "checkpoints" / "step_000006" / ".complete").unlink()
    return cut


def assert_same_weights(run_dir: Path, reference: Path) -> None:
    """The final weights, within float32 summation-order noise. Adam divides each update by the root
    of its second moment, so for a rarely seen byte's embedding, whose gradient is mostly that noise,
    the difference reaches ~1e-5; a lost optimizer state or data position would move weights by
    about the learning rate (3e-3) per step."""
    step = Path("checkpoints") / "step_000006"
    got = load_file(export(run_dir / step, run_dir / "final.safetensors"))
    expected = load_file(export(reference / step, reference / "final.safetensors"))
    assert got.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=1e-4, atol=1e-4)


# The default preset has no dropout, so no rank's RNG stream shapes the curve; what crosses layouts is
# the weights, the optimizer state, the step (and with it the learning rate) and the data position.
@pytest.mark.timeout(300)
def test_data_parallel_run_resumes_in_one_process(single, dp2, workdir):
    cut = cut_at_step_3(dp2[0], "dp2_to_one")
    out = check_ok(run_cli(["train", "--resume", str(cut), "dist.data_parallel_size=1"], workdir))
    assert f"resuming {cut} from step 3 of 6" in out
    assert "the checkpoint was saved as dp=2 tp=1 pp=1 zero_stage=0; continuing as 1 process" in out
    assert "on 1 process, cpu" in out
    assert load_spec(cut / "config.yaml")["dist"]["data_parallel_size"] == 1
    assert_same_curve(cut, dp2[0])
    assert_same_curve(cut, single)
    assert_same_weights(cut, single)


@pytest.mark.timeout(300)
def test_one_process_run_resumes_under_tensor_parallel(single, workdir):
    cut = cut_at_step_3(single, "one_to_tp2")
    out = check_ok(run_cli(["train", "--resume", str(cut), "dist.tensor_parallel_size=2"], workdir, nproc=2))
    assert out.count(f"resuming {cut} from step 3 of 6") == 1
    assert "the checkpoint was saved as 1 process; continuing as dp=1 tp=2 pp=1 zero_stage=0" in out
    assert load_spec(cut / "config.yaml")["dist"]["tensor_parallel_size"] == 2
    assert_same_curve(cut, single)
    assert_same_weights(cut, single)
