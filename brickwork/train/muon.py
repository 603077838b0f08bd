"""``train.optimizer: muon``: torch's Muon for the transformer blocks' matrices, AdamW for the rest.

Muon (Jordan et al., 2024) replaces each hidden matrix's momentum update by its nearest
semi-orthogonal matrix, found by a few Newton-Schulz iterations; its authors keep the embeddings,
the output head, norms and biases on AdamW, and so does brickwork. The Newton-Schulz step needs the
whole matrix, so only layouts that keep every parameter whole on its rank take it
(:func:`check_muon_layout`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from brickwork.blocks import Block
from brickwork.errors import ConfigError
from brickwork.parallel import ParallelConfig
from brickwork.parallel.state import parallel_state

PATH = "train.optimizer"


class MuonWithAdamW(torch.optim.Optimizer):
    """One optimizer whose param groups marked ``"muon": True`` torch's ``Muon`` steps, and the
    others torch's ``AdamW``.

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
            kind = torch.optim.Muon if group["muon"] else torch.optim.AdamW
            part = self.parts[group["muon"]] = kind([group], **self._options[group["muon"]])
            part.state = self.state
        else:
            part.add_param_group(group)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for part in self.parts.values():
            part.step()
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # torch's load makes new group dicts and a new state: the parts are pointed at them again.
        super().load_state_dict(state_dict)
        for muon, part in self.parts.items():
            part.param_groups = [group for group in self.param_groups if group["muon"] == muon]
            part.state = self.state


def muon_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The parameters Muon steps: the weight of every ``nn.Linear`` inside a transformer ``Block``
    (attention and feedforward projections, a mixture's router and experts).

    Found by module type, not by name: embeddings (token, position, patch), the LM or classifier
    head (tied to the embedding or not), poolers, norms and biases all sit outside the blocks or are
    not a Linear's weight, and go to AdamW. ``model`` may be what ``parallelize`` returned: its
    stages are searched.
    """
    state = parallel_state(model)
    found: dict[int, nn.Parameter] = {}
    for root in state.modules if state is not None else [model]:
        for block in (m for m in root.modules() if isinstance(m, Block)):
            for linear in (m for m in block.modules() if isinstance(m, nn.Linear)):
                if linear.weight.requires_grad:
                    found[id(linear.weight)] = linear.weight
    return list(found.values())


def check_muon_layout(layout: ParallelConfig) -> None:
    """Refuse, naming the dist option, a layout that splits parameters over ranks: Muon's
    Newton-Schulz orthogonalisation is not elementwise and needs each matrix whole. Tensor parallel
    shards the blocks' matrices over "tp"; zero_stage 2 and 3 run on FSDP2, which shards every
    parameter over the data-parallel ranks. DDP, ZeRO-1 (whole parameters, each stepped on one
    rank), pipeline, context and expert parallel keep them whole."""
    if layout.tensor_parallel_size > 1:
        raise ConfigError(
            f"muon orthogonalises each hidden matrix whole, and tensor parallel "
            f"(dist.tensor_parallel_size={layout.tensor_parallel_size}) leaves a shard of it on each "
            "rank; use adamw or sgd, or a layout without tensor parallel",
            PATH,
        )
    if layout.zero_stage >= 2:
        raise ConfigError(
            f"muon orthogonalises each hidden matrix whole, and dist.zero_stage={layout.zero_stage} "
            "(FSDP2) shards every parameter over the data-parallel ranks; use zero_stage 0 or 1, "
            "which keep the parameters whole, or adamw or sgd",
            PATH,
        )


def build_muon(
    model: nn.Module, options: dict[str, Any], adamw_groups: list[dict[str, Any]]
) -> MuonWithAdamW:
    """Muon over ``muon_matrices(model)`` (decayed by the first AdamW group's weight decay), AdamW
    over ``adamw_groups`` less those matrices; ``options`` are :class:`MuonWithAdamW`'s."""
    state = parallel_state(model)
    if state is not None:
        check_muon_layout(state.config)
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
