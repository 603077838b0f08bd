"""What writes a run folder loses nothing: a process refused the folder's lock touches nothing in it, a
full disk during a resume's rewrite of metrics.jsonl leaves the file whole, and a kill -9 while pruning
checkpoints leaves a folder the next start removes."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from cli_runs import SMALL, curve

from brickwork.checkpoint import is_complete
from brickwork.cli import main
from brickwork.errors import ConfigError
from brickwork.train.run_lock import RunLock

pytestmark = pytest.mark.slow

QUICK = [*SMALL, "decoder.num_layers=1", "train.sample_tokens=0", "train.eval_interval=2"]


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Runs in this process compute with one thread, as the child processes do (OMP_NUM_THREADS=1), so
    that a run one of them started and this process continued draws the same curve to the bit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def finished(workdir: Path) -> Path:
    """A finished run: checkpoints at steps 3 and 6."""
    assert main(["train", *QUICK, f"train.out_dir={workdir / 'finished'}"]) == 0
    return workdir / "finished"


def _child(script: str, args: list[str], cwd: Path, **popen: object) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def _wait_for_line(child: subprocess.Popen, text: str) -> None:
    for line in child.stdout:
        if line.startswith(text):
            return
    raise AssertionError(f"{text!r} never came: {child.stderr.read()}")


# Lets a child wait, at a point the test chooses, until the test creates a file in its folder.
WAIT_FOR = textwrap.dedent(
    """
    import os, sys, time
    from brickwork.cli import main
    from brickwork.train import trainer

    def wait_for(name):
        deadline = time.monotonic() + 120
        while not os.path.exists(name) and time.monotonic() < deadline:
            time.sleep(0.02)
    """
)

# Holds the lock with the run folder still empty (before config.yaml) until told to go on.
HOLDS_THE_LOCK = WAIT_FOR + textwrap.dedent(
    """
    run_data = trainer.run_data

    def held(*args):
        print("holding the lock", flush=True)
        wait_for("go-on")
        return run_data(*args)

    trainer.run_data = held
    sys.exit(main(sys.argv[1:]))
    """
)

# Finds no folder, then asks for the lock only once told to: by then the other run holds it.
COMES_SECOND = WAIT_FOR + textwrap.dedent(
    """
    class LateLock(trainer.RunLock):
        def __enter__(self):
            print("about to lock", os.path.exists(self.run_dir), flush=True)
            wait_for("lock-now")
            return super().__enter__()

    trainer.RunLock = LateLock
    sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.timeout(300)
def test_a_run_refused_the_lock_leaves_the_winners_folder_alone(tmp_path: Path) -> None:
    args = ["train", *QUICK, "train.out_dir=run"]
    second = _child(COMES_SECOND, args, tmp_path)
    first = None
    try:
        _wait_for_line(second, "about to lock False")  # it saw no folder
        first = _child(HOLDS_THE_LOCK, args, tmp_path)
        _wait_for_line(first, "holding the lock")
        run = tmp_path / "run"
        before = sorted(p.name for p in run.iterdir())
        (tmp_path / "lock-now").touch()
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2, err
        assert f"is in use by another training process (pid {first.pid})" in err
        assert sorted(p.name for p in run.iterdir()) == before and ".lock" in before
        with pytest.raises(ConfigError, match=f"pid {first.pid}"), RunLock(run):
            pass  # a third process is refused as well: the lock is still the first run's
        (tmp_path / "go-on").touch()
        _, err = first.communicate(timeout=240)
        assert first.returncode == 0, err
    finally:
        for child in (first, second):
            if child is not None:
                child.kill()
                child.wait(timeout=30)
    assert is_complete(run / "checkpoints" / "step_000006")


def _file_size_limit(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


@pytest.mark.timeout(300)
def test_a_full_disk_while_resume_rewrites_the_metrics_loses_no_record(
    finished: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    shutil.rmtree(run / "checkpoints" / "step_000006")  # the resume rewrites metrics.jsonl to step 3
    metrics = (run / "metrics.jsonl").read_bytes()
    script = "import sys; from brickwork.cli import main; sys.exit(main(sys.argv[1:]))"
    child = _child(script, ["train", "--resume", "run"], tmp_path, preexec_fn=lambda: _file_size_limit(256))
    _, err = child.communicate(timeout=240)
    assert child.returncode == 2, err
    line = err.strip()
    assert "\n" not in line and "could not rewrite" in line and "metrics.jsonl" in line, line
    assert "it is unchanged" in line
    assert (run / "metrics.jsonl").read_bytes() == metrics
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == [".lock"]
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--resume", "run"]) == 0  # with room again, nothing was lost
    assert curve(run) == curve(finished)


# Killed by SIGKILL as pruning starts to delete a step folder's files.
KILLED_WHILE_PRUNING = textwrap.dedent(
    """
    import os, shutil, signal, sys
    from pathlib import Path
    from brickwork.cli import main

    rmtree = shutil.rmtree

    def killed(path, *args, **kwargs):
        if Path(path).name.startswith("step_"):
            os.kill(os.getpid(), signal.SIGKILL)
        rmtree(path, *args, **kwargs)

    shutil.rmtree = killed
    sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.timeout(300)
def test_a_kill_while_pruning_leaves_an_unfinished_folder_the_next_start_removes(
    finished: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    args = ["train", *QUICK, "train.checkpoint_interval=2", "train.keep_checkpoints=1", "train.out_dir=run"]
    child = _child(KILLED_WHILE_PRUNING, args, tmp_path)
    _, err = child.communicate(timeout=240)
    assert child.returncode == -9, err  # at step 4, pruning step 2
    checkpoints = tmp_path / "run" / "checkpoints"
    assert is_complete(checkpoints / "step_000004")
    assert (checkpoints / "step_000002").is_dir() and not is_complete(checkpoints / "step_000002")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--resume", "run"]) == 0
    out = capsys.readouterr().out
    assert "removed checkpoints/step_000002: a save or a deletion of it was cut off" in out
    assert "resuming run from step 4 of 6" in out
    assert sorted(p.name for p in checkpoints.iterdir()) == ["best", "step_000006"]
    assert curve(tmp_path / "run") == curve(finished)
