"""Expert parallel: the experts of each mixture of experts split over groups of data-parallel ranks.

The GShard / DeepSpeed-MoE layout. With ``data_parallel_size`` dp and ``expert_parallel_size`` ep,
the dp ranks form dp/ep groups of ep consecutive ranks (the "ep" dim); rank i of a group holds
experts ``[i·E/ep, (i+1)·E/ep)`` of every MoE layer, under their single-process names. Each rank
routes its own tokens; the token rows go to the rank holding their expert by an all-to-all with
per-rank sizes (the counts are exchanged first), the experts run, and the reverse all-to-all brings
the results back to be mixed with the router weights. Both all-to-alls are torch's differentiable
``all_to_all_single_autograd``, so backward is torch's own. They sit around the MoE's
:class:`~brickwork.components.feedforward.moe.Experts` bank as forward hooks: the component knows
nothing of them.

Everything but the experts stays data-parallel over the whole dp group. An expert's gradient is
reduced over the ranks holding the same experts only (the "edp" dim, dp/ep ranks, one from each
group): by its own DDP (ZeRO-0) or its own FSDP2 unit (ZeRO-2/3), the main DDP/FSDP leaving it
out. The expert on one rank has already summed the gradients of the tokens of its ep peers, so
after that average its gradient is ep times the data-parallel one: :meth:`ExpertParallel.finish_gradients`
divides it by ep. The routing, the load-balancing loss and the expert counts are each rank's own,
exactly as under data parallel without expert parallel, so ep changes nothing numerically.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh

from brickwork.components.feedforward.moe import Experts, MixtureOfExperts
from brickwork.errors import ConfigError
from brickwork.parallel.config import ParallelConfig
from brickwork.parallel.state import layout_state

EXPERT_MESH_DIMS = ("pp", "edp", "ep", "tp")


def moe_layers(model: nn.Module) -> dict[str, MixtureOfExperts]:
    """Every mixture of experts in ``model``, by module path."""
    return {name: m for name, m in model.named_modules() if isinstance(m, MixtureOfExperts)}


def check_expert_parallel(model: nn.Module, config: ParallelConfig) -> None:
    """Raise ConfigError unless ``model`` can be split ``expert_parallel_size`` ways (no collective)."""
    ep = config.expert_parallel_size
    if ep == 1:
        return
    layers = moe_layers(model)
    if not layers:
        raise ConfigError(
            f"expert_parallel_size={ep} but {type(model).__name__} has no mixture-of-experts layer",
            "expert_parallel_size",
        )
    for name, moe in layers.items():
        if moe.num_experts % ep:
            raise ConfigError(
                f"{name} has {moe.num_experts} experts, which expert_parallel_size={ep} does not divide",
                "expert_parallel_size",
            )


def apply_expert_parallel(model: nn.Module, mesh: DeviceMesh, config: ParallelConfig) -> nn.Module:
    """Split the experts of every MoE of ``model`` over ``expert_parallel_size`` data-parallel ranks, in
    place, after :func:`check_expert_parallel`; the split is recorded in the model's ParallelState,
    for data parallel and training. Returns ``model``; nothing happens at expert_parallel_size 1."""
    check_expert_parallel(model, config)
    if config.expert_parallel_size == 1:
        return model
    if any(p.is_meta for p in model.parameters()):
        raise ConfigError(
            "expert parallel needs the real model on every rank (no meta-device init yet)",
            "expert_parallel_size",
        )
    layout_state(model, mesh, config).experts = ExpertParallel(model, config, mesh)
    return model


def expert_module_paths(model: nn.Module) -> set[str]:
    """The paths of every module inside an MoE's experts: under expert parallel tensor parallel leaves
    them whole (each rank's experts whole on each of its tp peers, which route the same tokens)."""
    return {
        f"{name}.experts.{sub}" if sub else f"{name}.experts"
        for name, moe in moe_layers(model).items()
        for sub, _ in moe.experts.named_modules()
    }


def build_expert_mesh(mesh: DeviceMesh, ep: int) -> DeviceMesh:
    """The (pp, dp, cp, tp) mesh with dp split into (edp, ep): ep groups of consecutive dp ranks.

    The cp dim is dropped: the config refuses expert parallel with context parallel, so it has size 1.
    Collective: every rank builds every group, in the same order. With dp=4, ep=2 (tp=pp=1) the ep
    groups are [0, 1], [2, 3] and the edp groups (same experts) [0, 2], [1, 3].
    """
    grid = mesh.mesh
    pp, dp, _, tp = grid.shape
    return DeviceMesh(mesh.device_type, grid.reshape(pp, dp // ep, ep, tp), mesh_dim_names=EXPERT_MESH_DIMS)


class AllToAllDispatch:
    """The forward hooks around one :class:`Experts` bank that move its rows to the ranks holding
    their experts and back. The bank's input: rows grouped by expert (all E), counts ``[E]``; what
    the kept experts see: the rows every peer sent them, grouped by local expert, counts ``[E/ep]``."""

    def __init__(self, group: dist.ProcessGroup, ep: int, local_experts: int) -> None:
        self.group, self.ep, self.local_experts = group, ep, local_experts
        # (order, sent, received) of each dispatch whose combine is still to come (a stack: the
        # recomputation of activation checkpointing runs a pair again).
        self._pending: list[tuple[torch.Tensor, list[int], list[int]]] = []

    def dispatch(self, _: nn.Module, args: tuple[Any, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        rows, counts = args
        send = counts.reshape(self.ep, self.local_experts)  # rows for each peer's each expert
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send.contiguous(), group=self.group)
        sent_rows, received_rows = send.sum(1).tolist(), received.sum(1).tolist()
        gathered = all_to_all_single_autograd(rows, received_rows, sent_rows, self.group)
        # gathered is ordered by peer, then local expert; the bank wants it by local expert.
        local = torch.arange(self.local_experts, device=counts.device).repeat(self.ep)
        order = local.repeat_interleave(received.flatten()).argsort(stable=True)
        self._pending.append((order, sent_rows, received_rows))
        return gathered[order], received.sum(0)

    def combine(self, _: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        order, sent_rows, received_rows = self._pending.pop()
        by_peer = output[order.argsort()]
        return all_to_all_single_autograd(by_peer, sent_rows, received_rows, self.group)

    def attach(self, bank: Experts) -> None:
        bank.register_forward_pre_hook(self.dispatch)
        bank.register_forward_hook(self.combine)


class ExpertParallel:
    """What ``parallelize`` did to the experts, and what training needs of it.

    ``banks`` are the split :class:`Experts` banks by their MoE's path; ``key_order`` the
    single-process state-dict keys, for putting the full state back together.
    """

    def __init__(self, model: nn.Module, config: ParallelConfig, mesh: DeviceMesh) -> None:
        self.ep = config.expert_parallel_size
        self.mesh = build_expert_mesh(mesh, self.ep)
        self.group = self.mesh["ep"].get_group()
        self.key_order = list(model.state_dict())
        rank = self.mesh["ep"].get_local_rank()
        self.banks: dict[str, Experts] = {}
        for name, moe in moe_layers(model).items():
            per_rank = moe.num_experts // self.ep
            moe.experts.keep(range(rank * per_rank, (rank + 1) * per_rank))
            AllToAllDispatch(self.group, self.ep, per_rank).attach(moe.experts)
            self.banks[name] = moe.experts

    def parameters(self) -> list[nn.Parameter]:
        """The expert parameters this rank holds."""
        return [p for bank in self.banks.values() for p in bank.parameters()]

    @torch.no_grad()
    def finish_gradients(self) -> None:
        """Divide the expert gradients by ep (see the module docstring); once, after the last backward."""
        for param in self.parameters():
            if param.grad is not None:
                param.grad.div_(self.ep)

    def gather_full_state(self, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's full state (its experts only) completed with its ep peers' experts, in the
        single-process key order. Collective over the ep group."""
        prefixes = tuple(f"{name}.experts." for name in self.banks)
        mine = {k: v for k, v in local.items() if k.startswith(prefixes)}
        parts: list[dict[str, torch.Tensor] | None] = [None] * self.ep
        dist.all_gather_object(parts, mine, group=self.group)
        merged = dict(local)
        for part in parts:
            merged.update(part or {})
        return {k: merged[k] for k in self.key_order if k in merged}
