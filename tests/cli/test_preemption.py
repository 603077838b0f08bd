"""A scheduler's stop loses nothing: SIGTERM or SIGUSR1, sent to a real ``brickwork train`` process (or to
torchrun, which forwards it), stops every rank after the same step with a checkpoint, one line and
status 128 + the signal; ``--resume`` then draws the uninterrupted run's curve. Ctrl-C stops at once
as before (under torchrun too, where a terminal's Ctrl-C reaches every rank), and a run it stopped
before any checkpoint continues from step 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from cli_runs import SMALL, curve, read_metrics, run_cli

from brickwork.checkpoint import complete_checkpoints, read_meta, verify_checkpoint
from brickwork.cli import main
from brickwork.train.run_lock import RunLock

QUICK = [*SMALL, "decoder.num_layers=1", "train.sample_tokens=0", "train.eval_interval=2"]

# The signals are blocked from the start, in every thread (threads inherit the mask), so one sent early
# stays pending; rank 0 lets it through at the step RECEIVE_AT_STEP names, and the loop's own handler
# receives it there. Other ranks never let it through: only rank 0 ever sees the stop (unless
# EVERY_RANK_RECEIVES: a Ctrl-C in a terminal reaches the whole process group).
SIGNAL_AT_STEP = textwrap.dedent(
    """
    import os, signal, sys, time
    HELD = {signal.SIGINT, signal.SIGTERM, signal.SIGUSR1}
    signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
    # A process started by a background job inherits SIGINT ignored, and Python then leaves it so;
    # the Ctrl-C these tests send is a terminal's, which Python turns into KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from brickwork.cli import main
    from brickwork.train.step import TrainStep

    every_rank = os.environ.get("EVERY_RANK_RECEIVES") == "1"
    at = int(os.environ["RECEIVE_AT_STEP"]) if every_rank or os.environ.get("RANK", "0") == "0" else 0
    call, calls = TrainStep.__call__, []

    def step(self, batch):
        calls.append(1)
        if len(calls) == at:
            print(f"waiting for a signal at step {at}", flush=True)
            deadline = time.monotonic() + 120
            while not HELD & signal.sigpending() and time.monotonic() < deadline:
                time.sleep(0.01)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)
        return call(self, batch)

    TrainStep.__call__ = step
    status = main(sys.argv[1:])
    print(f"rank {os.environ.get('RANK', '0')} exits with status {status}", flush=True)
    sys.exit(status)
    """
)


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Runs in this process compute with one thread, as the child processes do (OMP_NUM_THREADS=1), so
    that a run one of them started and this process continued draws the same curve to the bit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def reference(workdir: Path) -> list[tuple]:
    """The curve of the run never stopped."""
    assert main(["train", *QUICK, f"train.out_dir={workdir / 'reference'}"]) == 0
    return curve(workdir / "reference")


def signalled_run(
    tmp_path: Path, args: list[str], signum: int, at_step: int, torchrun: bool = False, group: bool = False
) -> subprocess.CompletedProcess:
    """Run ``brickwork ARGS`` in ``tmp_path``, send ``signum`` to it (to torchrun, which forwards it,
    when ``torchrun``; to its whole process group, every rank included, when ``group``, as a terminal's
    Ctrl-C does) once it is in step ``at_step``, and wait for it to end."""
    script = tmp_path / "signal_at_step.py"
    script.write_text(SIGNAL_AT_STEP)
    launcher = [sys.executable]
    if torchrun:
        launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "RECEIVE_AT_STEP": str(at_step)}
    env["EVERY_RANK_RECEIVES"] = "1" if group else "0"
    child = subprocess.Popen(
        [*launcher, str(script), *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=group,
    )
    try:
        lines = []
        for line in child.stdout:
            lines.append(line)
            if line.startswith(f"waiting for a signal at step {at_step}"):
                if group:
                    os.killpg(child.pid, signum)
                else:
                    child.send_signal(signum)
                break
        out, err = child.communicate(timeout=240)
    finally:
        child.kill()
    return subprocess.CompletedProcess(child.args, child.returncode, "".join(lines) + out, err)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("signum", "option", "resumed_from"),
    [(signal.SIGTERM, [], 4), (signal.SIGUSR1, ["train.checkpoint_on_preempt=false"], 3)],
    ids=["SIGTERM", "SIGUSR1-no-checkpoint"],
)
def test_a_stop_signal_ends_the_run_at_a_step_and_resume_continues_it(
    reference, tmp_path, capsys, monkeypatch, signum: int, option: list[str], resumed_from: int
) -> None:
    stopped = signalled_run(tmp_path, ["train", *QUICK, *option, "train.out_dir=run"], signum, at_step=4)
    name = signal.Signals(signum).name
    assert stopped.returncode == 128 + signum, stopped.stderr
    saved = "its checkpoint is run/checkpoints/step_000004" if not option else (
        "no checkpoint was saved there (train.checkpoint_on_preempt is false)"
    )  # fmt: skip
    assert stopped.stderr.strip() == (
        f"brickwork train: stopped by {name} after step 4 of 6; {saved}; continue with --resume run"
    )
    run = tmp_path / "run"
    assert [step for step, _ in complete_checkpoints(run)] == sorted({3, resumed_from})
    verify_checkpoint(run / "checkpoints" / f"step_{resumed_from:06d}")
    assert read_metrics(run)[-1]["step"] == 4  # nothing ran past the step it stopped after
    with RunLock(run):  # released
        pass
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--resume", "run"]) == 0
    assert f"resuming run from step {resumed_from} of 6" in capsys.readouterr().out
    assert curve(run) == reference


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_before_the_first_checkpoint_stops_at_once_and_resume_starts_over(
    reference, tmp_path, capsys, monkeypatch
) -> None:
    stopped = signalled_run(tmp_path, ["train", *QUICK, "train.out_dir=run"], signal.SIGINT, at_step=2)
    assert stopped.returncode == 130, stopped.stderr
    assert stopped.stderr.strip() == "brickwork train: interrupted"
    run = tmp_path / "run"
    assert complete_checkpoints(run) == [] and (run / "config.yaml").is_file()
    assert read_metrics(run)[-1]["step"] == 1  # Ctrl-C does not wait for the step to finish
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--resume", "run"]) == 0
    assert "run has no checkpoint yet: it starts again from step 0" in capsys.readouterr().out
    assert curve(run) == reference


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(400)
def test_under_torchrun_a_forwarded_sigterm_stops_every_rank_after_the_same_step(
    reference, tmp_path: Path
) -> None:
    args = ["train", *QUICK, "train.out_dir=run", "dist.data_parallel_size=2"]
    stopped = signalled_run(tmp_path, args, signal.SIGTERM, at_step=3, torchrun=True)
    assert stopped.returncode != 0  # torchrun itself ends as a process the signal stopped
    # Rank 0 received it during step 3; the flags the ranks exchange from the end of step 3 on stop both
    # after step 4. Rank 1 held its own copy of the signal back: it stopped for rank 0's.
    line = "stopped by SIGTERM after step 4 of 6; its checkpoint is run/checkpoints/step_000004;"
    assert stopped.stderr.count(line) == 1, stopped.stderr
    for rank in (0, 1):
        assert f"rank {rank} exits with status 143" in stopped.stdout
    assert "forcefully exiting" not in stopped.stderr  # no rank outlived torchrun's grace period
    run = tmp_path / "run"
    folder = run / "checkpoints" / "step_000004"
    verify_checkpoint(folder)
    assert read_meta(folder)["world_size"] == 2 and {p.name for p in (folder / "rng").iterdir()} == {
        "rank0.pt",
        "rank1.pt",
    }
    assert read_metrics(run)[-1]["step"] == 4
    resumed = run_cli(["train", "--resume", "run"], tmp_path, nproc=2)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming run from step 4 of 6" in resumed.stdout
    # The same records as the run never stopped, to float32 rounding: two processes sum in another
    # order than the one that drew the reference.
    got = curve(run)
    assert [[v is None for v in r] for r in got] == [[v is None for v in r] for r in reference]
    for a, b in zip(got, reference):
        known = [v for v in b if v is not None]
        assert [v for v in a if v is not None] == pytest.approx(known, rel=1e-5, abs=1e-6)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(400)
def test_under_torchrun_ctrl_c_stops_every_rank_at_once_and_resume_continues(
    reference, tmp_path: Path
) -> None:
    args = ["train", *QUICK, "train.out_dir=run", "dist.data_parallel_size=2"]
    stopped = signalled_run(tmp_path, args, signal.SIGINT, at_step=5, torchrun=True, group=True)
    assert stopped.returncode != 0
    assert "brickwork train: interrupted" in stopped.stderr, stopped.stderr
    run = tmp_path / "run"
    assert [step for step, _ in complete_checkpoints(run)] == [3]  # step 5 never finished
    resumed = run_cli(["train", "--resume", "run"], tmp_path, nproc=2)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming run from step 3 of 6" in resumed.stdout
    got = curve(run)
    assert [[v is None for v in r] for r in got] == [[v is None for v in r] for r in reference]
    for a, b in zip(got, reference):
        known = [v for v in b if v is not None]
        assert [v for v in a if v is not None] == pytest.approx(known, rel=1e-5, abs=1e-6)
