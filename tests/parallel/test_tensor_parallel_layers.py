"""Megatron-style layers at tp=2 train exactly like their plain torch twins on one process."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from brickwork.parallel import full_state_dict, spawn
from brickwork.parallel.tensor.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    tensor_parallel_mesh,
)

pytestmark = pytest.mark.distributed

VOCAB, DIM, HIDDEN, OUT = 37, 8, 12, 6  # 37 rows split 19 / 18: an uneven vocabulary shard
STEPS = 3


class Plain(nn.Module):
    """The single-process model: embedding -> linear -> gelu -> linear -> linear (full in, full out)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.up = nn.Linear(DIM, HIDDEN)
        self.down = nn.Linear(HIDDEN, DIM)
        self.head = nn.Linear(DIM, OUT)
        self.last = nn.Linear(OUT, OUT)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        return self.last(self.head(x + self.down(F.gelu(self.up(x)))))


class Parallel(nn.Module):
    """The same model from the parallel layers, built in the same order, so equal seeds give equal weights."""

    def __init__(self, mesh) -> None:
        super().__init__()
        self.embed = VocabParallelEmbedding(VOCAB, DIM, mesh=mesh)
        self.up = ColumnParallelLinear(DIM, HIDDEN, mesh=mesh)  # output stays split ...
        self.down = RowParallelLinear(HIDDEN, DIM, mesh=mesh)  # ... and is consumed split
        self.head = ColumnParallelLinear(DIM, OUT, gather_output=True, mesh=mesh)
        self.last = RowParallelLinear(OUT, OUT, input_is_parallel=False, mesh=mesh)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        return self.last(self.head(x + self.down(F.gelu(self.up(x)))))


def _train(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for ids, target in batches:
        loss = F.mse_loss(model(ids), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.randint(0, VOCAB, (3, 5), generator=generator), torch.randn(3, 5, OUT, generator=generator))
        for _ in range(STEPS)
    ]


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return full_state_dict(model)


def _reference() -> tuple[list[float], dict[str, torch.Tensor], torch.Tensor]:
    torch.manual_seed(0)
    model = Plain()
    losses = _train(model, _batches())
    return losses, _state(model), model(torch.arange(VOCAB).view(1, -1)).detach()


def _parallel(mesh_shape: tuple[int, ...], names: tuple[str, ...]) -> tuple:
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    torch.manual_seed(0)
    model = Parallel(mesh)
    losses = _train(model, _batches())
    shard_rows = model.embed.weight.to_local().shape[0]
    refusals = []
    for bad in (VOCAB, -1):  # no rank holds these rows: without the check they would embed as zeros
        try:
            model(torch.tensor([[0, bad]]))
            refusals.append("")
        except IndexError as error:
            refusals.append(str(error))
    return losses, _state(model), model(torch.arange(VOCAB).view(1, -1)).detach(), shard_rows, refusals


def test_one_process_is_the_plain_model() -> None:
    torch.manual_seed(0)
    losses = _train(Parallel(None), _batches())
    reference, _, _ = _reference()
    assert losses == reference


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("shape", "names"), [((2,), ("tp",)), ((1, 2), ("dp", "tp"))], ids=["1d", "2d"])
def test_tp2_trains_like_one_process(shape: tuple[int, ...], names: tuple[str, ...]) -> None:
    ref_losses, ref_state, ref_out = _reference()
    for rank, (losses, state, out, rows, refusals) in enumerate(
        spawn(_parallel, 2, shape, names, timeout=150)
    ):
        assert rows == (19, 18)[rank]
        assert refusals == [f"token ids must be in [0, {VOCAB}), got ids from 0 to {VOCAB}",
                            f"token ids must be in [0, {VOCAB}), got ids from -1 to 0"]  # fmt: skip
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
        for name, value in ref_state.items():
            torch.testing.assert_close(state[name], value, rtol=1e-5, atol=1e-6, msg=name)
        torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)


def test_a_mesh_without_a_tp_dim_is_refused() -> None:
    class FakeMesh:
        ndim, mesh_dim_names = 2, ("pp", "dp")

    with pytest.raises(ValueError, match="dim named 'tp'"):
        tensor_parallel_mesh(FakeMesh())  # type: ignore[arg-type]
