"""A tiny decoder trained by brickwork's optimizers and schedule, a float64 Newton-Schulz to run
Muon's orthogonalisation without rounding, and the functions the spawned ranks of the Muon layout
tests run (they must live in an importable module)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
import torch.optim._muon
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.placement_types import Placement
from train_cases import global_batches, share, spec

from brickwork.factory import build_model
from brickwork.parallel import full_state_dict, load_checkpoint, parallelize, save_checkpoint
from brickwork.train import TrainStep
from brickwork.train.config import TrainConfig
from brickwork.train.optim import build_optimizer, learning_rate, set_learning_rate
from brickwork.train.sharded_muon import ShardedMuon

MUON = TrainConfig(optimizer="muon", steps=3, warmup_steps=0, lr=1e-2, min_lr=1e-3, grad_clip=0.0)
# Keller Jordan's quintic Newton-Schulz coefficients, torch's defaults.
NS = (3.4445, -4.7750, 2.0315)


def newton_schulz(m: torch.Tensor, steps: int) -> torch.Tensor:
    """The quintic iteration X <- aX + (bXX^T + c(XX^T)^2)X on m / ||m||_F, in float64, on the wide
    orientation (rows <= columns)."""
    a, b, c = NS
    x = m.double()
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = x / x.norm()
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


@contextlib.contextmanager
def float64_newton_schulz() -> Iterator[None]:
    """Within it torch's Muon orthogonalises in float64 (:func:`newton_schulz`), not bfloat16, so
    layouts differ only by the float32 rounding of their gradients."""

    def orthogonalise(grad: torch.Tensor, coefficients: tuple, steps: int, eps: float) -> torch.Tensor:
        assert tuple(coefficients) == NS and not isinstance(grad, DTensor)
        return newton_schulz(grad, steps).to(grad.dtype)

    with mock.patch.object(torch.optim._muon, "_zeropower_via_newtonschulz", orthogonalise):
        yield


def decoder() -> nn.Module:
    """train_cases' decoder without attention biases. The key bias gets no gradient in exact
    arithmetic (softmax is blind to a term that is the same for every key), so AdamW steps it along
    nothing but float32 rounding, which differs between layouts, by about lr."""
    layout = spec("decoder")
    layout["decoder"]["block"]["attention"]["bias"] = False
    torch.manual_seed(0)
    return build_model(layout)


def train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    cfg: TrainConfig,
    batches: list[dict[str, torch.Tensor]],
    first_step: int = 0,
) -> list[float]:
    """The loop ``brickwork train`` runs, without the files: the schedule's lr, then one step per
    batch; ``first_step`` is the index of the first batch's step. Returns the losses."""
    step = TrainStep(model, optimizer, "causal_lm")
    losses = []
    for index, batch in enumerate(batches, start=first_step):
        set_learning_rate(optimizer, learning_rate(index, cfg))
        losses.append(step(batch))
    return losses


def run_layouts(layouts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """On each rank: the decoder trained by Muon (float64 Newton-Schulz) under each dist layout on
    its share of the global batches: the losses and the full weights, by layout name."""
    out: dict[str, Any] = {}
    for name, layout in layouts.items():
        model = parallelize(decoder(), layout)
        with float64_newton_schulz():
            batches = [share(model, batch) for batch in global_batches("decoder")]
            losses = train(model, build_optimizer(model, MUON), MUON, batches)
        out[name] = {"losses": losses, "state": full_state_dict(model)}
    return out


def resumed_layout(layout: dict[str, Any], folder: str) -> dict[str, torch.Tensor]:
    """On each rank: :func:`run_layouts`' training of ``layout`` stopped after 2 steps, saved to
    ``folder``, loaded into a fresh model and optimizer and taken to the end: the full weights."""
    models = [parallelize(decoder(), layout) for _ in range(2)]
    optimizers = [build_optimizer(model, MUON) for model in models]
    batches = [share(models[0], batch) for batch in global_batches("decoder")]
    with float64_newton_schulz():
        train(models[0], optimizers[0], MUON, batches[:2])
        save_checkpoint(folder, models[0], optimizers[0], 2)
        load_checkpoint(folder, models[1], optimizers[1])
        train(models[1], optimizers[1], MUON, batches[2:], first_step=2)
    return full_state_dict(models[1])


def sharded_steps(shape: tuple[int, int], split: Placement) -> dict[str, Any]:
    """On each of 2 ranks: 3 ShardedMuon steps (torch's bfloat16 Newton-Schulz) of a matrix split by
    ``split``, held as a DTensor and as a local shard carrying its layout (DDP + tensor parallel's
    form); the whole matrices after, and the collectives of each step."""
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    start, grads = torch.randn(shape), [torch.randn(shape) for _ in range(3)]
    dtensor = nn.Parameter(distribute_tensor(start, mesh, [split]))
    local = nn.Parameter(dtensor.to_local().clone())
    local._st_info = dtensor._spec
    optimizers = [ShardedMuon([p], lr=0.1, adjust_lr_fn="match_rms_adamw") for p in (dtensor, local)]
    collectives = []
    for grad in grads:
        dtensor.grad = distribute_tensor(grad, mesh, [split])
        local.grad = dtensor.grad.to_local().clone()
        for optimizer in optimizers:
            with CommDebugMode() as comm:
                optimizer.step()
            collectives.append({str(op): n for op, n in comm.get_comm_counts().items()})
    whole = DTensor.from_local(
        local.detach(), mesh, dtensor.placements, shape=dtensor.shape, stride=dtensor.stride()
    )
    return {"dtensor": dtensor.full_tensor(), "local": whole.full_tensor(), "collectives": collectives}
