"""Gradient-norm clipping when the gradients are split over several mesh dims.

Each rank holds pieces of the gradient: DTensor shards (tensor parallel, FSDP), replicas (DDP) or,
with pipeline parallel, whole parameters of its own stage. The norm that clipping needs is the norm
of the full gradient, as one process would compute it: the squared local pieces are summed over
exactly the process groups across which they differ, then over ``extra_groups`` (the pipeline).
The clip factor is torch's: ``max_norm / (norm + 1e-6)``, at most 1. Where no gradient is split or
reduced across ranks (one process, DDP) and all are float32, torch's ``clip_grad_norm_`` itself runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def _pieces(param: torch.Tensor) -> tuple[torch.Tensor, tuple[dist.ProcessGroup, ...]]:
    """This rank's gradient data and the groups over which the other pieces of it live."""
    grad = param.grad
    if isinstance(grad, DTensor):
        mesh, placements = grad.device_mesh, grad.placements
        local = grad.to_local()
    elif hasattr(param, "_st_info"):
        # A tensor-parallel parameter that DDP turned into its local shard keeps its layout here.
        mesh, placements = param._st_info.mesh, param._st_info.placements
        local = grad
    else:
        return grad, ()
    if any(p.is_partial() for p in placements):
        raise RuntimeError(f"gradient with a pending reduction {placements} reached clipping")
    # _StridedShard (FSDP over TP) is a shard too, though is_shard() says no.
    groups = tuple(mesh.get_group(i) for i, p in enumerate(placements) if not p.is_replicate())
    return local, groups


@torch.no_grad()
def settle_gradients(parameters: Iterable[torch.Tensor]) -> None:
    """Carry out pending reductions: a DTensor gradient takes its parameter's placements.

    A replicated parameter used on sequence-sharded activations (a norm under sequence parallel)
    gets a Partial gradient; it is all-reduced here, once, before clipping and the optimizer see it.
    """
    for param in parameters:
        grad = param.grad
        if isinstance(grad, DTensor) and grad.placements != param.placements:
            param.grad = grad.redistribute(param.device_mesh, param.placements)


@torch.no_grad()
def clip_grad_norm(
    parameters: Iterable[torch.Tensor],
    max_norm: float,
    extra_groups: Sequence[dist.ProcessGroup] = (),
    duplicates: Sequence[torch.Tensor] = (),
    split_over: Sequence[tuple[Sequence[torch.Tensor], dist.ProcessGroup]] = (),
) -> torch.Tensor:
    """Scale this rank's gradients in place so the full gradient's 2-norm is at most ``max_norm``.

    ``duplicates`` are parameters among ``parameters`` that another rank of ``extra_groups`` holds too
    (a tied weight on two pipeline stages): they are scaled but counted only once, by that other rank.
    ``split_over``: parameters that are different tensors on each rank of a group (experts split over
    expert parallel), whose squares are summed over that group too.
    Returns the norm before clipping (a float32 scalar, the same on every rank). Every rank of the
    model must call it: it runs collectives.
    """
    pieces = [(param, *_pieces(param)) for param in parameters if param.grad is not None]
    if not (extra_groups or duplicates or split_over) and all(
        not groups and local.dtype == torch.float32 for _, local, groups in pieces
    ):
        # Every gradient is whole on this rank (one process, DDP): torch's own clipping, cheaper than the
        # float64 sums below and bit for bit what a single-process loop calling it computes.
        return torch.nn.utils.clip_grad_norm_([param for param, _, _ in pieces], max_norm)
    skip = {id(p) for p in duplicates}
    spread = {id(p): (group,) for params, group in split_over for p in params}
    # The counted local pieces by the groups they are summed over (keyed by the groups' ids).
    counted: dict[tuple[int, ...], tuple[tuple[dist.ProcessGroup, ...], list[torch.Tensor]]] = {}
    locals_ = []
    for param, local, groups in pieces:
        locals_.append(local)
        if id(param) in skip:
            continue
        groups += spread.get(id(param), ())
        counted.setdefault(tuple(id(g) for g in groups), (groups, []))[1].append(local)
    device = locals_[0].device if locals_ else torch.device("cpu")
    total = torch.zeros((), dtype=torch.float64, device=device)
    # Same parameters in the same order on every rank of a stage, so the collectives line up.
    for groups, tensors in counted.values():
        # One list-wide call, not several per tensor: each call costs the host a dispatch, which on a
        # small model's CPU step adds up to more than the arithmetic. The norms are float64, as the sums.
        value = torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float64)).square().sum()
        for group in groups:
            dist.all_reduce(value, group=group)
        total = total + value.to(device)
    for group in extra_groups:
        dist.all_reduce(total, group=group)
    norm = total.sqrt().float()
    scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    by_kind: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for local in locals_:
        by_kind.setdefault((local.device, local.dtype), []).append(local)
    for (where, dtype), tensors in by_kind.items():
        torch._foreach_mul_(tensors, scale.to(where, dtype))
    return norm
