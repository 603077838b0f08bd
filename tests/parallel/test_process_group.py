"""The default process group: on CUDA bound to this process's GPU, so that ``barrier`` and every other
collective know their device (torch warns 'barrier(): using the device under current context'
otherwise); on CPU a gloo group bound to nothing."""

from __future__ import annotations

import warnings
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from brickwork.parallel.mesh import launched_config, start_process_group


@pytest.fixture
def four_gpus(monkeypatch: pytest.MonkeyPatch) -> tuple[list, list]:
    """A node of four GPUs as torch.cuda reports them, and a process group start that is only
    recorded: (init_process_group calls, set_device calls)."""
    started: list[tuple[tuple, dict]] = []
    current: list[torch.device] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda *args, **kwargs: started.append((args, kwargs)))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    return started, current


def test_under_torchrun_the_group_is_bound_to_the_local_rank_gpu(four_gpus, monkeypatch) -> None:
    started, current = four_gpus
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("MASTER_ADDR", "localhost")  # the rest of what a launcher sets
    monkeypatch.setenv("MASTER_PORT", "29500")
    start_process_group(launched_config({"device_type": "cuda", "timeout_s": 30}))
    gpu = torch.device("cuda", 1)
    assert started == [(("nccl",), {"timeout": timedelta(seconds=30), "device_id": gpu})]
    assert current == [gpu]  # current before the start, so NCCL sets up on this GPU


def test_a_launcher_without_local_rank_takes_the_global_rank_modulo_the_gpus(four_gpus, monkeypatch) -> None:
    started, current = four_gpus
    monkeypatch.setenv("RANK", "6")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("MASTER_ADDR", "localhost")  # the rest of what a launcher sets
    monkeypatch.setenv("MASTER_PORT", "29500")
    start_process_group(launched_config({"device_type": "cuda"}))
    assert started[0][1]["device_id"] == torch.device("cuda", 2) == current[0]


def test_a_plain_python_process_is_a_world_of_one_on_gpu_0(four_gpus) -> None:
    started, current = four_gpus
    start_process_group(launched_config({"device_type": "cuda"}))
    ((args, kwargs),) = started
    assert args == ("nccl",) and kwargs["rank"] == 0 and kwargs["world_size"] == 1
    assert isinstance(kwargs["store"], dist.HashStore)
    assert kwargs["device_id"] == torch.device("cuda", 0) == current[0]


def test_a_cpu_group_is_gloo_bound_to_no_device(four_gpus) -> None:
    started, current = four_gpus
    start_process_group(launched_config({"device_type": "cpu"}))
    ((args, kwargs),) = started
    assert args == ("gloo",) and kwargs["device_id"] is None and current == []


def test_a_real_cpu_world_of_one_starts_and_passes_a_barrier_without_warnings(monkeypatch) -> None:
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    monkeypatch.delenv("RANK", raising=False)
    start_process_group(launched_config({"device_type": "cpu"}))
    try:
        assert dist.get_backend() == "gloo" and dist.get_world_size() == 1
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            dist.barrier()
    finally:
        dist.destroy_process_group()
