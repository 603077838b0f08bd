"""xformers' ``MixtureOfExperts`` on brickwork's mixture of experts (components/feedforward/moe.py).

The gates keep xformers' names. ``top_2`` sends each token to its two most likely experts, weighted
by their router probabilities scaled to sum to one: GShard's gate without its capacity limit, so no
token is dropped however unevenly the router splits them. ``round_robin`` sends token i (of the
batch read row by row) to expert i mod E, with weight one. The experts are xformers' ``MLP``, or
what ``expert_constructor`` makes.

Every process holds all ``number_of_experts`` experts, which computes what xformers' split over the
process group computed: splitting them is brickwork's expert parallel,
``parallelize(model, {"data_parallel_size": N, "expert_parallel_size": ...})``, so
``number_of_local_experts`` is checked but places nothing, and ``group`` is not used. After each
forward the inner ``moe`` holds ``aux_loss`` (the load-balancing loss) and ``expert_counts``, and
``brickwork train`` adds ``aux_loss_weight * aux_loss`` to the objective.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from enum import Enum
from typing import Any

import torch
from torch import nn

from brickwork.components.feedforward import MixtureOfExperts as BrickworkMoE
from brickwork.components.feedforward.moe import Experts
from brickwork.errors import ConfigError
from brickwork.xformers.components.activations import Activation
from brickwork.xformers.components.feedforward.base import Feedforward, FeedforwardConfig
from brickwork.xformers.components.feedforward.mlp import MLP

DEFAULT_MULTIPLIER = 4  # xformers' expert MLP width, in multiples of dim_model


class GateConfig(str, Enum):
    RoundRobin = "round_robin"
    Top2 = "top_2"


@dataclasses.dataclass
class MoEConfig(FeedforwardConfig):
    number_of_experts: int
    gate: GateConfig
    number_of_local_experts: int | None = None
    expert_constructor: Any = None
    hidden_layer_multiplier: int | None = None
    group: Any = None


class RoundRobinMoE(BrickworkMoE):
    """Token i to expert i mod E with weight one; no router to learn, so no load-balancing loss."""

    def route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = tokens.shape[0]
        chosen = torch.arange(n, device=tokens.device)[:, None] % self.num_experts
        probs = nn.functional.one_hot(chosen[:, 0], self.num_experts).to(torch.float32)
        return probs, torch.ones(n, 1, device=tokens.device), chosen


class MixtureOfExperts(Feedforward):
    """x ``[B, T, dim_model]`` -> ``[B, T, dim_model]``: each token through its gate's experts."""

    def __init__(
        self,
        dim_model: int,
        dropout: float,
        activation: Activation | str,
        number_of_experts: int,
        gate: GateConfig | str,
        number_of_local_experts: int | None = None,
        expert_constructor: Callable[[], nn.Module] | None = None,
        hidden_layer_multiplier: int | None = None,
        group: Any = None,
        *_: Any,
        **__: Any,
    ) -> None:
        super().__init__()
        if number_of_local_experts is not None and not 0 < number_of_local_experts <= number_of_experts:
            raise ConfigError(
                f"must be in [1, number_of_experts={number_of_experts}], got {number_of_local_experts}",
                "number_of_local_experts",
            )
        try:
            gate = GateConfig(gate)
        except ValueError:
            raise ConfigError(f"unknown gate {gate!r}", "gate", [g.value for g in GateConfig], gate) from None
        if expert_constructor is None:
            multiplier = DEFAULT_MULTIPLIER if hidden_layer_multiplier is None else hidden_layer_multiplier
            expert_constructor = functools.partial(MLP, dim_model, dropout, activation, multiplier)

        top2 = gate is GateConfig.Top2
        with torch.device("meta"):  # brickwork's own experts and router are replaced: allocate neither
            if top2:
                self.moe = BrickworkMoE(dim_model, number_of_experts, top_k=min(2, number_of_experts))
            else:
                self.moe = RoundRobinMoE(dim_model, number_of_experts, top_k=1, aux_loss_weight=0.0)
        # Round robin reads no router: no parameter that never gets a gradient.
        self.moe.router = nn.Linear(dim_model, number_of_experts, bias=False) if top2 else None
        self.moe.experts = Experts([expert_constructor() for _ in range(number_of_experts)])

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.moe(inputs)
