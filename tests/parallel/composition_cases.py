"""What spawned ranks run in the composition tests: the apply_* steps used one by one, without parallelize."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from parallel_cases import STEPS, batches, build, logits_of, next_token_loss, optimizer
from torch.distributed.tensor import DTensor

from brickwork.parallel import (
    ParallelConfig,
    apply_activation_checkpointing,
    apply_data_parallel,
    apply_tensor_parallel,
    build_mesh,
    full_state_dict,
    parallel_state,
)


def tensor_parallel_alone(kind: str) -> dict[str, Any]:
    """tp=2 and full activation checkpointing applied step by step; trained by a plain torch loop."""
    config = ParallelConfig.from_dict({"tensor_parallel_size": 2, "activation_checkpointing": "full"}, 2)
    mesh = build_mesh(config)
    model = apply_activation_checkpointing(apply_tensor_parallel(build(kind), mesh, config), config)
    opt = optimizer(model.parameters(), "sgd")
    ids, labels = batches()
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        logits = logits_of(model(ids[step]))
        loss = next_token_loss(logits.full_tensor() if isinstance(logits, DTensor) else logits, labels[step])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    sharded = sum(isinstance(p, DTensor) for p in model.parameters())
    return {"losses": losses, "state": full_state_dict(model), "sharded": sharded}


def data_parallel_alone(kind: str) -> dict[str, Any]:
    """dp=2 (DDP) applied alone: each rank trains on its half of every batch."""
    config = ParallelConfig.from_dict({"data_parallel_size": 2}, 2)
    model = apply_data_parallel(build(kind), build_mesh(config), config)
    opt = optimizer(model.parameters(), "sgd")
    ids, labels = batches()
    half = ids.shape[1] // 2
    rows = slice(dist.get_rank() * half, (dist.get_rank() + 1) * half)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        loss = next_token_loss(logits_of(model(ids[step, rows])), labels[step, rows])
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / 2)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return {"losses": losses, "state": state, "ddps": len(parallel_state(model).ddps)}


def both(kind: str) -> dict[str, Any]:
    return {"tp": tensor_parallel_alone(kind), "dp": data_parallel_alone(kind)}


def odd_sequence_under_sequence_parallel(kind: str) -> str:
    """tp=2 with sequence parallel, given a sequence of odd length: the error each rank raises."""
    config = ParallelConfig.from_dict({"tensor_parallel_size": 2, "sequence_parallel": True}, 2)
    model = apply_tensor_parallel(build(kind), build_mesh(config), config)
    ids, _ = batches()
    try:
        model(ids[0][:, :-1])
    except ValueError as err:
        return str(err)
    return "no error"
