"""``train.async_checkpoint``: training goes on while a checkpoint is written; the checkpoint holds the
state of the step it was taken at, the same tensors as a synchronous save, and counts (``.complete``,
pruning after it) only once written; a resumed run continues exactly; a process killed during the write
leaves every earlier checkpoint loadable, and the resume takes the newest complete one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from async_checkpoint_cases import held_writes, stored_tensors, sync_and_held_async
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from brickwork.checkpoint import (
    complete_checkpoints,
    is_complete,
    latest_checkpoint,
    read_meta,
    verify_checkpoint,
)
from brickwork.cli import main
from brickwork.errors import ConfigError
from brickwork.factory import build_model
from brickwork.option_types import to_config
from brickwork.parallel import spawn
from brickwork.parallel.launch import free_port
from brickwork.train import TrainStep
from brickwork.train.checkpoint import (
    CheckpointWriteError,
    load_run_checkpoint,
    save_run_checkpoint,
    write_failed,
)
from brickwork.train.checkpoint_writer import CheckpointWriter
from brickwork.train.config import TrainConfig
from brickwork.train.optim import build_optimizer
from brickwork.train.resume_overrides import check_resume_overrides
from brickwork.train.run_config import resolve_run

RUN = [
    "train.steps=4",
    "train.batch_size=4",
    "train.seq_len=16",
    "train.eval_interval=2",
    "train.eval_batches=1",
    "train.checkpoint_interval=2",
    "train.keep_checkpoints=0",
    "train.sample_tokens=0",
    "train.schedule=constant",
    "train.warmup_steps=0",
    "decoder.num_layers=1",
]


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One compute thread, as in the child processes, so that in-process runs compare to the bit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_option_is_a_flag_off_by_default_and_may_change_on_resume() -> None:
    assert TrainConfig().async_checkpoint is False
    assert to_config(TrainConfig, {"async_checkpoint": True}, "train").async_checkpoint is True
    for value in ("yes", 1, None):
        with pytest.raises(ConfigError) as err:
            to_config(TrainConfig, {"async_checkpoint": value}, "train")
        assert err.value.path == "train.async_checkpoint"
    with pytest.raises(ConfigError, match="must be true or false") as err:
        TrainConfig(async_checkpoint="true")
    assert err.value.path == "async_checkpoint"
    check_resume_overrides(["train.async_checkpoint=true"])


def _linear() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def _step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad()
    model(torch.ones(2, 8)).square().sum().backward()
    optimizer.step()


def _steps(run_dir: Path) -> list[int]:
    return [step for step, _ in complete_checkpoints(run_dir)]


def test_training_goes_on_while_the_write_is_held_and_the_checkpoint_counts_only_after_it(
    tmp_path: Path,
) -> None:
    model, optimizer = _linear()
    args = ({}, 1.0)
    _step(model, optimizer)
    run = tmp_path / "run"
    with CheckpointWriter(run, 1, True, True, 60) as writer:
        writer.save(1, model, optimizer, *args)
        writer.wait()
        assert _steps(run) == [1]
        _step(model, optimizer)
        save_run_checkpoint(tmp_path / "sync", 2, model, optimizer, *args)
        with held_writes() as (held, release):
            folder = writer.save(2, model, optimizer, *args)
            _step(model, optimizer)  # the weights change while the write of step 2 waits
            _step(model, optimizer)
            assert held.wait(timeout=60)
            assert not is_complete(folder) and _steps(run) == [1]  # not counted, nothing pruned
            # Released from another thread while this one is already in the next save, which must
            # wait for step 2 (and the pruning after it) before it returns; step 3's write is held.
            threading.Timer(0.2, release.set).start()
            with held_writes() as (_, release_step_3):
                writer.save(3, model, optimizer, *args)
                assert _steps(run) == [2]  # keep_checkpoints=1 pruned step 1 once step 2 was complete
                got, meta = stored_tensors(folder), read_meta(folder)
                release_step_3.set()
                writer.wait()
    assert _steps(run) == [3]
    want = stored_tensors(tmp_path / "sync" / "checkpoints" / "step_000002")
    assert got.keys() == want.keys() and len(got) == 9  # weight, bias; their step, exp_avg, exp_avg_sq; rng
    for key in want:
        assert torch.equal(got[key], want[key]), key
    assert meta == read_meta(tmp_path / "sync" / "checkpoints" / "step_000002")


def test_a_failed_write_is_raised_by_the_next_wait_and_leaves_the_earlier_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, optimizer = _linear()
    failed = pytest.raises(CheckpointWriteError, match="could not write the checkpoint of step 2")
    with failed as err, CheckpointWriter(tmp_path, 1, True, True, 60) as writer:
        writer.save(1, model, optimizer, {}, 1.0)
        writer.wait()
        monkeypatch.setattr(os, "fsync", _no_space)  # every DCP file is synced once written
        writer.save(2, model, optimizer, {}, 1.0)
        raise KeyError("an error of the loop, leaving while the write is in flight")
    assert isinstance(err.value.__context__, KeyError)  # the loop's error is kept beside it
    assert "No space left on device" in str(err.value)
    assert _steps(tmp_path) == [1] and not (tmp_path / "checkpoints" / "step_000002").exists()


def _no_space(_: int) -> None:
    raise OSError(28, os.strerror(28))


def test_a_write_that_lost_a_peer_is_raised_as_the_peer_error(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints" / "step_000002"
    folder.mkdir(parents=True)
    lost = RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500")
    raised = write_failed(CheckpointException("save", {1: (lost, traceback.StackSummary())}), 2, folder)
    assert raised is lost and not folder.exists()  # peers.py names the lost peer, not a full disk


def _curve(run_dir: Path) -> list[tuple]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [(r["step"], r.get("loss"), r.get("val_loss")) for r in map(json.loads, lines)]


def test_an_async_run_saves_the_sync_runs_tensors_and_its_resume_continues_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["train", *RUN, "train.steps=6", "train.out_dir=sync"]) == 0
    assert main(["train", *RUN, "train.async_checkpoint=true", "train.out_dir=async"]) == 0
    assert main(["train", "--resume", "async", "train.steps=6"]) == 0
    assert _curve(Path("async")) == _curve(Path("sync"))
    assert _steps(Path("async")) == _steps(Path("sync")) == [2, 4, 6]
    for (_, want), (_, got) in zip(complete_checkpoints(Path("sync")), complete_checkpoints(Path("async"))):
        expected, saved = stored_tensors(want), stored_tensors(got)
        assert saved.keys() == expected.keys()
        for key in expected:
            assert torch.equal(saved[key], expected[key]), (got, key)


def test_a_preempted_run_stops_with_its_checkpoint_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    call, calls = TrainStep.__call__, []

    def signalled_in_step_3(self: TrainStep, batch: dict) -> float:
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # the loop's handler takes it; the step goes on
        return call(self, batch)

    monkeypatch.setattr(TrainStep, "__call__", signalled_in_step_3)
    assert main(["train", *RUN, "train.async_checkpoint=true", "train.out_dir=run"]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err.strip() == (
        "brickwork train: stopped by SIGTERM after step 3 of 4; its checkpoint is "
        "run/checkpoints/step_000003; continue with --resume run"
    )
    assert _steps(Path("run")) == [2, 3]
    for _, folder in complete_checkpoints(Path("run")):
        verify_checkpoint(folder)


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_ddp_fsdp2_and_tp_stage_the_state_and_write_the_sync_tensors(tmp_path: Path) -> None:
    cases = [
        ("ddp", {"data_parallel_size": 2}),
        ("fsdp2", {"data_parallel_size": 2, "zero_stage": 3}),
        ("tp", {"tensor_parallel_size": 2}),
    ]
    ranks = spawn(sync_and_held_async, 2, str(tmp_path), cases, timeout=100)
    for key, _ in cases:
        assert not any(rank[key]["complete_while_held"] for rank in ranks)
        want = stored_tensors(tmp_path / key / "sync" / "checkpoints" / "step_000001")
        got = stored_tensors(tmp_path / key / "async" / "checkpoints" / "step_000001")
        assert got.keys() == want.keys() and any(k.startswith("optim.") for k in got), key
        for name in want:
            assert torch.equal(got[name], want[name]), (key, name)


# Every rank's DCP write of step 3 waits forever, after saying so in a file; the main thread trains on.
HOLD_STEP_3 = textwrap.dedent(
    """
    import os, sys, threading
    from pathlib import Path
    from torch.distributed.checkpoint import FileSystemWriter
    from brickwork.cli import main

    write = FileSystemWriter.write_data

    def held(self, *args, **kwargs):
        if Path(self.path).name == "step_000003":
            Path(f"held.{os.environ['RANK']}").write_text("")
            threading.Event().wait()
        return write(self, *args, **kwargs)

    FileSystemWriter.write_data = held
    sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_a_kill_during_the_write_leaves_the_earlier_checkpoints_and_resume_takes_the_newest(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = [*RUN, "train.checkpoint_interval=1", "train.async_checkpoint=true", "train.out_dir=run"]
    layout = ["dist.data_parallel_size=2", "dist.zero_stage=3", "dist.timeout_s=60"]
    port = free_port()
    children = [_rank(HOLD_STEP_3, ["train", *args, *layout], tmp_path, r, port) for r in (0, 1)]
    try:
        held = _held_past_step_4(tmp_path, children)
        for child in children:
            child.send_signal(signal.SIGKILL)
    finally:
        for child in children:
            child.kill()
        outputs = [child.communicate()[1][-3000:] for child in children]
    assert held, outputs
    run = tmp_path / "run"
    assert _steps(run) == [1, 2] and not is_complete(run / "checkpoints" / "step_000003")
    assert latest_checkpoint(run, intact=True)[0] == 2
    spec, train = (
        read_meta(run / "checkpoints" / "step_000002")["spec"],
        resolve_run(str(run / "config.yaml"), []).train,
    )
    for step, folder in [*complete_checkpoints(run), (None, run / "checkpoints" / "best")]:
        model = build_model(spec)
        optimizer = build_optimizer(model.parameters(), train)
        assert load_run_checkpoint(folder, model, optimizer)[0]["step"] == (step or read_meta(folder)["step"])
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--resume", "run", "dist.data_parallel_size=1", "dist.zero_stage=0"]) == 0
    out = capsys.readouterr().out
    assert "removed checkpoints/step_000003" in out and "resuming run from step 2 of 4" in out
    assert _steps(run) == [1, 2, 3, 4]


def _rank(script: str, args: list[str], cwd: Path, rank: int, port: int) -> subprocess.Popen:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": "2",
    }
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _held_past_step_4(cwd: Path, children: list[subprocess.Popen]) -> bool:
    """Wait until both ranks' writes are held and rank 0 has recorded step 4 (training went on past the
    held save); False if a rank ends first or two minutes pass."""
    metrics = cwd / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and all(child.poll() is None for child in children):
        held = (cwd / "held.0").exists() and (cwd / "held.1").exists()
        if (
            held
            and metrics.exists()
            and any(json.loads(line)["step"] == 4 for line in metrics.read_text().splitlines())
        ):
            return True
        time.sleep(0.05)
    return False
