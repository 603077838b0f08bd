"""This process's rank, node index and world size, from torchrun's environment before the process group
starts and from torch.distributed after; and which process prints the error a command ends on."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from brickwork import launch_env
from brickwork.error_report import speaks
from brickwork.errors import ConfigError, RunFailure

TORCHRUN = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch):
    """A process with no launcher's variables and no process group, and a way to set variables."""
    if dist.is_initialized():  # a group an earlier in-process test left up would answer instead
        dist.destroy_process_group()
    for name in TORCHRUN:
        monkeypatch.delenv(name, raising=False)

    def set_variables(**variables: str) -> None:
        for name, value in variables.items():
            monkeypatch.setenv(name, value)

    return set_variables


def _answers() -> tuple[bool, int, int | None, int, int, bool]:
    return (
        launch_env.launched(),
        launch_env.rank(),
        launch_env.local_rank(),
        launch_env.world_size(),
        launch_env.local_world_size(),
        launch_env.is_first_rank(),
    )


def test_a_plain_python_process_is_rank_0_of_a_world_of_one(environment) -> None:
    assert _answers() == (False, 0, None, 1, 1, True)


def test_a_torchrun_process_answers_from_its_environment(environment) -> None:
    environment(**TORCHRUN)
    assert _answers() == (True, 3, 1, 4, 2, False)
    launch_env.check_launch_environment()  # nothing missing


def test_a_world_size_without_rank_was_not_set_by_a_launcher(environment) -> None:
    environment(WORLD_SIZE="4", LOCAL_WORLD_SIZE="4")
    assert _answers() == (False, 0, None, 1, 1, True)


def test_a_rank_without_the_rest_is_refused_before_a_group_starts(environment) -> None:
    environment(RANK="2", MASTER_PORT="29500")
    assert _answers() == (True, 2, None, 1, 1, False)  # no LOCAL_WORLD_SIZE: the world's size
    with pytest.raises(RunFailure) as caught:
        launch_env.check_launch_environment()
    assert str(caught.value) == (
        "RANK=2 is set, but WORLD_SIZE, MASTER_ADDR are not: this process was not started by torchrun (or a "
        "launcher that sets them together); unset RANK to run one process, or launch the run with torchrun"
    )


@pytest.mark.parametrize("name", ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"])
def test_a_variable_that_is_not_a_process_number_is_named(environment, name: str) -> None:
    environment(**{**TORCHRUN, name: "-1"})
    with pytest.raises(RunFailure, match=f"^{name}='-1' is not a process number"):
        _answers()


def test_once_the_group_is_up_torch_distributed_answers(environment) -> None:
    environment(**TORCHRUN)  # the environment says rank 3 of 4; the group started says 0 of 1
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        got = _answers()
        assert got == (True, dist.get_rank(), 1, dist.get_world_size(), 2, True) == (True, 0, 1, 1, 2, True)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    ("variables", "says_a_shared_mistake"),
    [
        ({}, True),
        ({"RANK": "0", "WORLD_SIZE": "2"}, True),
        ({"RANK": "1", "WORLD_SIZE": "2"}, False),  # rank 0 says it once
        ({"RANK": "1"}, True),  # no world above it: alone
        ({"RANK": "3", "WORLD_SIZE": "2"}, True),  # a rank outside its world: alone
        ({"RANK": "1", "WORLD_SIZE": "two"}, True),
        ({"WORLD_SIZE": "2"}, True),
    ],
)
def test_which_process_says_the_error(environment, variables: dict, says_a_shared_mistake: bool) -> None:
    environment(**variables)
    assert speaks(ConfigError("bad", "train.steps")) is says_a_shared_mistake
    assert speaks(RunFailure("a peer stopped"))  # differs by rank: every rank says its own
