"""``train.optimizer: muon``: torch's Muon for the transformer blocks' matrices, AdamW for the rest.

Muon (Jordan et al., 2024) replaces each hidden matrix's momentum update by its nearest
semi-orthogonal matrix, found by a few Newton-Schulz iterations; its authors keep the embeddings,
the output head, norms and biases on AdamW, and so does brickwork. The Newton-Schulz step needs the
whole matrix: under tensor parallel and FSDP2 each rank gathers it (brickwork/train/sharded_muon.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from brickwork.blocks import Block
from brickwork.errors import ConfigError
from brickwork.parallel.state import parallel_state
from brickwork.train.sharded_muon import ShardedMuon

PATH = "train.optimizer"


class MuonWithAdamW(torch.optim.Optimizer):
    """One optimizer whose param groups marked ``"muon": True`` torch's ``Muon`` steps (as
    :class:`ShardedMuon`, exact for sharded matrices), and the others torch's ``AdamW``.

    ``params`` are param groups as any torch optimizer takes them; ``lr``, ``weight_decay`` and
    ``muon`` are every group's defaults, ``momentum``, ``nesterov``, ``ns_steps`` and ``adjust_lr_fn``
    Muon's, ``betas`` and ``fused`` AdamW's. As in torch's optimizers, every group option is a
    constructor argument too: ZeRO-1 rebuilds this optimizer from the first group's options, then
    adds the other groups with ``add_param_group``, which hands each to its part.

    Each group is the very dict the part stepping it holds, and the parts share this optimizer's
    ``state`` (keyed by parameter, as any torch optimizer's), so a learning-rate schedule, ZeRO-1's
    copy of the settings and a checkpoint reach both through ``param_groups`` and ``state``.
    """

    def __init__(
        self,
        params: Iterable[dict[str, Any]],
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.95),
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        adjust_lr_fn: str = "match_rms_adamw",
        fused: bool | None = None,
        muon: bool = False,
    ) -> None:
        self._options: dict[bool, dict[str, Any]] = {
            True: {
                "momentum": momentum,
                "nesterov": nesterov,
                "ns_steps": ns_steps,
                "adjust_lr_fn": adjust_lr_fn,
            },
            False: {"betas": betas, "fused": fused},
        }
        self.parts: dict[bool, torch.optim.Optimizer] = {}
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "muon": muon})

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        part = self.parts.get(group["muon"])
        if part is None:
            kind = ShardedMuon if group["muon"] else torch.optim.AdamW
            part = self.parts[group["muon"]] = kind([group], **self._options[group["muon"]])
            part.state = self.state
        else:
            part.add_param_group(group)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        # torch's step runs the closure first, with gradients on: the first part's runs it for all.
        first, *rest = self.parts.values()
        loss = first.step(closure)
        for part in rest:
            part.step()
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # torch's load makes new group dicts and a new state: the parts are pointed at them again.
        super().load_state_dict(state_dict)
        for muon, part in self.parts.items():
            part.param_groups = [group for group in self.param_groups if group["muon"] == muon]
            part.state = self.state


def muon_matrices(model: nn.Module) -> list[torch.Tensor]:
    """The tensors Muon steps: the weight of every ``nn.Linear`` inside a transformer ``Block``
    (attention and feedforward projections, a mixture's router and experts).

    Found by module type, not by name: embeddings (token, position, patch), the LM or classifier
    head (tied to the embedding or not), poolers, norms and biases all sit outside the blocks or are
    not a Linear's weight, and go to AdamW. ``model`` may be what ``parallelize`` returned: its
    stages are searched, and each weight is the tensor the optimizer steps for it (under DDP +
    tensor parallel its local shard, not the DTensor view the Linear holds).
    """
    state = parallel_state(model)
    trainable = state.trainable() if state is not None else None
    found: dict[int, torch.Tensor] = {}
    for root in state.modules if state is not None else [model]:
        for block_name, block in root.named_modules():
            if not isinstance(block, Block):
                continue
            for name, linear in block.named_modules(prefix=block_name):
                if isinstance(linear, nn.Linear) and linear.weight.requires_grad:
                    weight = linear.weight if trainable is None else trainable[f"{name}.weight"]
                    found[id(weight)] = weight
    return list(found.values())


def build_muon(
    model: nn.Module, options: dict[str, Any], adamw_groups: list[dict[str, Any]]
) -> MuonWithAdamW:
    """Muon over ``muon_matrices(model)`` (decayed by the first AdamW group's weight decay), AdamW
    over ``adamw_groups`` less those matrices; ``options`` are :class:`MuonWithAdamW`'s."""
    matrices = muon_matrices(model)
    if not matrices:
        raise ConfigError(
            f"muon steps the matrices of transformer blocks, and {type(model).__name__} has none; "
            "use adamw or sgd",
            PATH,
        )
    taken = {id(p) for p in matrices}
    rest = [{**group, "params": [p for p in group["params"] if id(p) not in taken]} for group in adamw_groups]
    muon = {"params": matrices, "weight_decay": adamw_groups[0]["weight_decay"], "muon": True}
    return MuonWithAdamW([muon, *rest], **options)
