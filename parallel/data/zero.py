"""ZeRO-1: each data-parallel rank keeps the optimizer state of its 1/dp of the parameters, through
torch's ``ZeroRedundancyOptimizer``; under expert parallel the experts are stepped beside it."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence, Set
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.optim import ZeroRedundancyOptimizer


class ZeroOptimizers:
    """ZeRO-1: the optimizer a user built is re-created as a ZeroRedundancyOptimizer over the dp group.

    Each rank keeps the optimizer state of its 1/dp of the parameters only. The user's optimizer
    stays the source of hyperparameters: its param-group values (e.g. an LR schedule's ``lr``) are
    copied over before every step. ``experts`` (expert parallel: different tensors on each rank) are
    left out of the ZeRO partition and stepped by a plain optimizer of the same class beside it
    (:class:`ZeroBesideExperts`).
    """

    def __init__(self, dp_mesh: DeviceMesh, experts: Sequence[nn.Parameter] = ()) -> None:
        self.group = dp_mesh.get_group()
        self._experts = {id(p) for p in experts}
        # By id of the user's optimizer, which the step pre-hook below keeps alive (its id stays unique).
        self._by_user: dict[int, ZeroRedundancyOptimizer | ZeroBesideExperts] = {}

    def get(self, optimizer: torch.optim.Optimizer) -> ZeroRedundancyOptimizer | ZeroBesideExperts:
        if isinstance(optimizer, ZeroRedundancyOptimizer | ZeroBesideExperts):
            return optimizer
        stepped = self._by_user.get(id(optimizer))
        if stepped is None:
            # Only what the class's constructor takes: defaults may hold derived keys (AdamW's
            # decoupled_weight_decay) that its __init__ does not accept.
            accepted = set(inspect.signature(type(optimizer).__init__).parameters)
            groups = [
                {**group, "params": [p for p in group["params"] if id(p) not in self._experts]}
                for group in optimizer.param_groups
            ]
            options = {k: v for k, v in groups[0].items() if k in accepted and k != "params"}
            zero = ZeroRedundancyOptimizer(
                groups[0].pop("params"), optimizer_class=type(optimizer), process_group=self.group, **options
            )
            for group in groups[1:]:
                zero.add_param_group(group)
            stepped = ZeroBesideExperts(zero, optimizer, self._experts, options) if self._experts else zero
            # A schedule sets the user's lr between steps, long after this was first asked for.
            zero.register_step_pre_hook(functools.partial(_copy_settings, optimizer, stepped))
            self._by_user[id(optimizer)] = stepped
        _copy_settings(optimizer, stepped)
        return stepped


def _copy_settings(user: torch.optim.Optimizer, stepped: Any, *_: Any) -> None:
    """The user's param-group values (all but the parameters) into the optimizers that step for it."""
    for owned in stepped.parts if isinstance(stepped, ZeroBesideExperts) else [stepped]:
        for user_group, group in zip(user.param_groups, owned.param_groups):
            group.update({k: v for k, v in user_group.items() if k != "params"})


class ZeroBesideExperts:
    """ZeRO-1 under expert parallel: the ZeroRedundancyOptimizer ``zero`` steps the parameters every dp
    rank shares (each rank keeping the state of its 1/dp of them), and a plain optimizer of the
    user's class, with the user's param groups and hyperparameters, steps this rank's experts (their
    state is already split ep ways). ``options``: the user's constructor options. ``optim`` is the
    local view checkpoints read and fill."""

    def __init__(
        self,
        zero: torch.optim.Optimizer,
        user: torch.optim.Optimizer,
        experts: Set[int],
        options: dict[str, Any],
    ) -> None:
        groups = [
            {**group, "params": [p for p in group["params"] if id(p) in experts]}
            for group in user.param_groups
        ]
        self.zero = zero
        self.experts = type(user)(groups, **options)
        self.parts = [zero, self.experts]
        self.optim = _LocalOptimizers(
            lambda p: self.experts if id(p) in experts else zero.optim,
            zero.optim.param_groups + self.experts.param_groups,
        )

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The groups as the user's optimizer has them (the ZeRO optimizer's, one per user group)."""
        return self.zero.param_groups

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = self.zero.step(closure)
        self.experts.step()
        return loss


class _LocalOptimizers:
    """This rank's two local optimizers seen as one: ``state[param]`` is the state of whichever steps
    ``param`` (created on first use, as a torch optimizer's is), ``param_groups`` both lists."""

    def __init__(self, owner: Callable[[torch.Tensor], torch.optim.Optimizer], groups: list[dict]) -> None:
        self.state = _RoutedState(owner)
        self.param_groups = groups


class _RoutedState:
    def __init__(self, owner: Callable[[torch.Tensor], torch.optim.Optimizer]) -> None:
        self._owner = owner

    def __getitem__(self, param: torch.Tensor) -> dict[str, Any]:
        return self._owner(param).state[param]

    def get(self, param: torch.Tensor, default: Any = None) -> Any:
        return self._owner(param).state.get(param, default)
