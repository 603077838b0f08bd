"""``brickwork train`` on two torchrun "nodes" of this machine (c10d rendezvous, 2 processes each),
dp2 × tp2, draws the same curve as one process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runs import SMALL, check_ok, run_cli
from test_train_torchrun import assert_same_curve

from brickwork.parallel.launch import free_port

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


def _node(rank: int, port: int, args: list[str], cwd: Path) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes=2", f"--node-rank={rank}", "--nproc-per-node=2",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=brickwork-test",
        "--local-addr=127.0.0.1", "-m", "brickwork", *args,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.timeout(400)
def test_two_nodes_dp2_tp2_match_one_process(workdir: Path) -> None:
    check_ok(run_cli(["train", *SMALL, "train.out_dir=single"], workdir))
    layout = ["dist.data_parallel_size=2", "dist.tensor_parallel_size=2"]
    args = ["train", *SMALL, "train.out_dir=two-nodes", *layout]
    port = free_port()
    nodes = [_node(rank, port, args, workdir) for rank in (0, 1)]
    outputs = []
    try:
        for node in nodes:
            out, err = node.communicate(timeout=360)
            outputs.append(out)
            assert node.returncode == 0, f"exit {node.returncode}\nstdout:\n{out}\nstderr:\n{err}"
    finally:
        for node in nodes:
            node.kill()
    # One of the four processes is rank 0 and prints; the layout is the 4-process one.
    assert sum(out.count("4 processes (cpu): dp=2 tp=2") for out in outputs) == 1
    assert_same_curve(workdir / "two-nodes", workdir / "single")
