"""Helpers for running ``brickwork`` as a subprocess, as a user would, and reading its run folders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# A few steps of the default preset, with checkpoints and evaluations along the way.
SMALL = [
    "train.steps=6",
    "train.batch_size=4",
    "train.seq_len=32",
    "train.eval_interval=3",
    "train.eval_batches=2",
    "train.checkpoint_interval=3",
    "train.keep_checkpoints=0",
    "train.sample_tokens=24",
]


def run_cli(args: list[str], cwd: Path, nproc: int = 1, timeout: float = 240) -> subprocess.CompletedProcess:
    """``python -m brickwork ARGS`` (under torchrun when ``nproc > 1``); fails the test on a timeout."""
    if nproc > 1:
        launcher = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
        ]
        command = [*launcher, "-m", "brickwork", *args]
    else:
        command = [sys.executable, "-m", "brickwork", *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def check_ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, (
        f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )
    return result.stdout


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def curve(run_dir: Path) -> list[tuple]:
    """The loss curve of a run: (step, train loss, val loss, lr), without timings."""
    return [(r["step"], r.get("loss"), r.get("val_loss"), r.get("lr")) for r in read_metrics(run_dir)]
