"""Faults injected into real ``brickwork train`` runs end in one clear line and lose nothing: a NaN on
the validation split only, a full disk, a killed rank, a peer that never comes, and sizes no machine
holds (refused before the run folder exists)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from cli_runs import SMALL

from brickwork.checkpoint import read_meta, verify_checkpoint
from brickwork.cli import main
from brickwork.parallel.launch import free_port
from brickwork.train import loop

QUICK = [*SMALL, "decoder.num_layers=1", "train.sample_tokens=8", "train.eval_interval=2"]
EVERY_TWO = [*QUICK, "train.checkpoint_interval=2", "train.keep_checkpoints=1"]


def error_line(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_a_nan_on_the_validation_split_only_stops_before_it_is_saved(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    evaluate, calls = loop.evaluate, []

    def nan_at_step_four(*args: object, **kwargs: object) -> float:
        calls.append(1)
        loss = evaluate(*args, **kwargs)
        return math.nan if len(calls) == 3 else loss  # evaluations at steps 0, 2, 4

    monkeypatch.setattr(loop, "evaluate", nan_at_step_four)
    err = error_line(capsys, ["train", *EVERY_TWO, "train.out_dir=run"])
    assert "the validation loss became nan at step 4; no checkpoint was saved from that state" in err
    checkpoints = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["best", "step_000002"]
    for folder in checkpoints.iterdir():
        verify_checkpoint(folder)
        assert read_meta(folder)["step"] == 2


def _child(script: str, args: list[str], cwd: Path, **env: str) -> subprocess.Popen:
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **env}
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=cwd,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


DISK_FILLS_AFTER_THE_FIRST_CHECKPOINT = textwrap.dedent(
    """
    import resource, sys
    from brickwork.cli import main
    from brickwork.train import checkpoint_writer

    sys.modules["matplotlib"] = None  # no loss.png: only the checkpoint files grow
    retain = checkpoint_writer.retain

    def retain_then_fill(*args):
        retain(*args)
        # From here no file may grow past 32 KiB, which the next checkpoint's weights exceed.
        resource.setrlimit(resource.RLIMIT_FSIZE, (32768, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    checkpoint_writer.retain = retain_then_fill
    sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.timeout(300)
def test_a_full_disk_ends_in_one_line_and_keeps_the_earlier_checkpoint(tmp_path: Path) -> None:
    child = _child(
        DISK_FILLS_AFTER_THE_FIRST_CHECKPOINT, ["train", *EVERY_TWO, "train.out_dir=run"], tmp_path
    )
    _, err = child.communicate(timeout=280)
    assert child.returncode == 2, err
    line = err.strip()
    assert "\n" not in line and line.startswith(
        "brickwork train: error: could not write the checkpoint of step 4"
    )
    assert "the partial folder was removed and the earlier checkpoints are intact" in line
    checkpoints = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["best", "step_000002"]
    verify_checkpoint(checkpoints / "step_000002")


RANK_1_DIES_AT_STEP_3 = textwrap.dedent(
    """
    import os, signal, sys
    from brickwork.cli import main
    from brickwork.train.step import TrainStep

    if os.environ["RANK"] == "1":
        call, steps = TrainStep.__call__, []

        def dying(self, batch):
            steps.append(1)
            if len(steps) == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            return call(self, batch)

        TrainStep.__call__ = dying
    sys.exit(main(sys.argv[1:]))
    """
)


def _rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    return {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
    }


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_a_killed_rank_ends_the_other_with_a_clear_error(tmp_path: Path) -> None:
    args = ["train", *EVERY_TWO, "train.out_dir=run", "dist.data_parallel_size=2", "dist.timeout_s=60"]
    port = free_port()
    ranks = [_child(RANK_1_DIES_AT_STEP_3, args, tmp_path, **_rank_env(r, 2, port)) for r in (0, 1)]
    started = time.monotonic()
    _, err = ranks[0].communicate(timeout=280)
    ranks[1].communicate(timeout=30)
    assert ranks[1].returncode == -9
    assert ranks[0].returncode == 2, err
    # A closed connection is seen at once; dist.timeout_s bounds it when it is not.
    assert time.monotonic() - started < 200
    line = err.strip()
    assert "\n" not in line, line
    assert line.startswith("brickwork train: error: rank 0: another process of the run stopped")
    assert "dist.timeout_s=60 s" in line and line.endswith("with --resume run")
    verify_checkpoint(tmp_path / "run" / "checkpoints" / "step_000002")


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_a_peer_that_never_comes_ends_the_run_within_the_timeout(tmp_path: Path) -> None:
    args = ["train", *QUICK, "train.out_dir=run", "dist.data_parallel_size=2", "dist.timeout_s=3"]
    started = time.monotonic()
    alone = _child("import sys; from brickwork.cli import main; sys.exit(main(sys.argv[1:]))", args, tmp_path,
                   **_rank_env(0, 2, free_port()))  # fmt: skip
    _, err = alone.communicate(timeout=100)
    assert alone.returncode == 2, err
    line = err.strip()
    assert "\n" not in line, line
    assert "did not answer within dist.timeout_s=3 s" in line and "1/2 clients joined" in line
    assert "--resume" not in line  # there is nothing to resume
    assert time.monotonic() - started < 90
    assert not (tmp_path / "run").exists()  # a run that wrote nothing leaves no folder


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "train.batch_size=1000000000",
            "train.batch_size: batch_size=1000000000 x seq_len=32 needs at least",
        ),
        ("train.seq_len=1000000000000", "train.seq_len: batch_size=4 x seq_len=1000000000000 needs at least"),
        ("decoder.num_layers=100000000", "decoder.num_layers: 100000000 layers of"),
    ],
)
def test_sizes_no_machine_holds_are_refused_before_the_run_folder(
    capsys, tmp_path, monkeypatch, override: str, message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    started = time.monotonic()
    err = error_line(capsys, ["train", *QUICK, override, "train.out_dir=run"])
    assert message in err
    assert time.monotonic() - started < 30
    assert not (tmp_path / "run").exists()


def test_resume_drops_a_torn_last_metrics_line_and_says_so(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["train", *QUICK, "train.out_dir=run"]) == 0
    metrics = tmp_path / "run" / "metrics.jsonl"
    whole = metrics.read_text()
    metrics.write_text(whole + '{"step": 7, "loss": 2.4')  # the crash came mid-write
    capsys.readouterr()
    assert main(["train", "--resume", "run"]) == 0
    assert f"{Path('run') / 'metrics.jsonl'}: dropped its last line, cut off by a crash mid-write" in (
        capsys.readouterr().out
    )
    assert metrics.read_text() == whole


def test_a_damaged_metrics_line_before_the_last_is_refused_naming_the_file(
    capsys, tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["train", *QUICK, "train.out_dir=run"]) == 0
    metrics = tmp_path / "run" / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    lines[2] = lines[2][:-5]
    metrics.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    err = error_line(capsys, ["train", "--resume", "run"])
    assert f"--resume: {Path('run') / 'metrics.jsonl'} line 3 is not a metrics record" in err
