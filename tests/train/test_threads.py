"""The CPU thread count of a training process: usable cores shared among the node's processes."""

from __future__ import annotations

import os

import pytest
import torch

from brickwork.train import threads


@pytest.fixture(autouse=True)
def _restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _machine(monkeypatch: pytest.MonkeyPatch, cores: int, quota: str | None, tmp_path) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for name in ("LOCAL_WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    cpu_max = tmp_path / "cpu.max"
    if quota is not None:
        cpu_max.write_text(quota)
    monkeypatch.setattr(threads, "CGROUP_CPU_MAX", cpu_max)
    torch.set_num_threads(64)  # torch's default on a large machine: one per physical core


def test_a_process_pinned_to_fewer_cores_uses_only_those(monkeypatch, tmp_path) -> None:
    _machine(monkeypatch, cores=3, quota=None, tmp_path=tmp_path)
    assert threads.cpu_threads() == (3, "3 usable cores (CPU affinity)")
    assert threads.apply_cpu_threads().threads == 3 and torch.get_num_threads() == 3


def test_a_cgroup_quota_limits_the_cores(monkeypatch, tmp_path) -> None:
    _machine(monkeypatch, cores=64, quota="250000 100000", tmp_path=tmp_path)
    assert threads.cpu_threads() == (3, "3 usable cores (cgroup CPU quota)")
    _machine(monkeypatch, cores=8, quota="max 100000", tmp_path=tmp_path)
    assert threads.cpu_threads().threads == 8


def test_processes_on_one_node_share_the_cores(monkeypatch, tmp_path) -> None:
    _machine(monkeypatch, cores=8, quota=None, tmp_path=tmp_path)
    monkeypatch.setenv("RANK", "0")  # launched: torchrun sets both
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert threads.cpu_threads() == (2, "8 usable cores (CPU affinity) shared by 3 processes on this node")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")
    assert threads.cpu_threads().threads == 1
    monkeypatch.delenv("RANK")  # a plain process: a LOCAL_WORLD_SIZE left in its shell is not its node's
    assert threads.cpu_threads().threads == 8


def test_a_lower_count_already_set_is_kept(monkeypatch, tmp_path) -> None:
    _machine(monkeypatch, cores=8, quota=None, tmp_path=tmp_path)
    torch.set_num_threads(2)
    assert threads.apply_cpu_threads() == (2, "8 usable cores (CPU affinity); torch's count of 2 is lower")
    assert torch.get_num_threads() == 2


def test_omp_num_threads_wins(monkeypatch, tmp_path) -> None:
    _machine(monkeypatch, cores=8, quota=None, tmp_path=tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    torch.set_num_threads(5)
    assert threads.cpu_threads() == (5, "OMP_NUM_THREADS=5")
