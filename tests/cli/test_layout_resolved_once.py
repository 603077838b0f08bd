"""One ``brickwork train`` resolves its dist layout into one ``ParallelConfig`` per process, which
every later step (the checks, the data, the process group, ``parallelize``, the step) is handed;
counted inside each process by tests/cli/layout_count.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runs import check_ok

from brickwork.factory import load_spec

# The fewest steps that still evaluate and save once.
TINY = [
    "train",
    "train.steps=1",
    "train.batch_size=2",
    "train.seq_len=16",
    "train.eval_interval=1",
    "train.eval_batches=1",
    "train.checkpoint_interval=1",
    "train.sample_tokens=2",
]


def counted_run(workdir: Path, args: list[str], nproc: int) -> list[int]:
    """``brickwork ARGS`` (under torchrun for ``nproc`` > 1); the ParallelConfig objects each rank built."""
    counts = workdir / "built"
    launcher = [sys.executable]
    if nproc > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    command = [*launcher, "-m", "layout_count", str(counts), *TINY, *args]
    check_ok(subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=240))
    return [int(Path(f"{counts}.{rank}").read_text()) for rank in range(nproc)]


@pytest.mark.timeout(300)
def test_one_process_builds_one_layout(workdir: Path):
    assert counted_run(workdir, ["train.out_dir=one"], nproc=1) == [1]
    # config.yaml's dist dict is that layout's, every key spelled out.
    assert load_spec(workdir / "one" / "config.yaml")["dist"]["tensor_parallel_size"] == 1


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_each_torchrun_rank_builds_one_layout(workdir: Path):
    args = ["train.out_dir=tp2", "dist.tensor_parallel_size=2"]
    assert counted_run(workdir, args, nproc=2) == [1, 1]
    assert load_spec(workdir / "tp2" / "config.yaml")["dist"]["tensor_parallel_size"] == 2
