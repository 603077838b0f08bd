"""xformers' mixture-of-experts gate names. xformers' ``MixtureOfExperts`` ran on FairScale's MoE layer
and was registered only where FairScale was installed; it is not registered here: use brickwork's own
``moe`` feedforward (top-k routing, ``brickwork.components.feedforward.MixtureOfExperts``)."""

from __future__ import annotations

from enum import Enum


class GateConfig(str, Enum):
    RoundRobin = "round_robin"
    Top2 = "top_2"
