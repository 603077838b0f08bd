"""xformers' ``InputProjection``: the q/k/v projections, optionally sharing weights."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn


@dataclasses.dataclass
class InputProjectionConfig:
    in_features: int
    out_features: int
    bias: bool


class InputProjection(nn.Module):
    """``q_proj``, ``k_proj``, ``v_proj``. A missing key or value config reuses the query projection;
    ``use_separate_proj_weight=False`` ties the three weights (their biases stay separate)."""

    def __init__(
        self,
        query_proj_params: InputProjectionConfig,
        key_proj_params: InputProjectionConfig | None,
        value_proj_params: InputProjectionConfig | None,
        use_separate_proj_weight: bool = True,
    ) -> None:
        super().__init__()
        self.out_features = query_proj_params.out_features

        def linear(p: InputProjectionConfig) -> nn.Linear:
            return nn.Linear(p.in_features, p.out_features, p.bias)

        self.q_proj = linear(query_proj_params)
        self.k_proj = linear(key_proj_params) if key_proj_params is not None else self.q_proj
        self.v_proj = linear(value_proj_params) if value_proj_params is not None else self.q_proj
        if not use_separate_proj_weight:
            self.k_proj.weight = self.q_proj.weight
            self.v_proj.weight = self.q_proj.weight

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each input ``[B, T, in]`` through its projection -> ``[B, T, out]``."""
        return self.q_proj(query), self.k_proj(key), self.v_proj(value)
