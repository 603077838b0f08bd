"""xformers' feedforward registry (``MLP``, ``Conv2DFeedforward``) on brickwork's feedforwards.

``FusedMLP`` (a Triton MLP) is brickwork's MLP, whose GELU already fuses with its bias on CUDA; it is
registered everywhere, so a config naming it builds on CPU too (the plain MLP there).
``MixtureOfExperts`` runs on brickwork's mixture of experts (mixture_of_experts.py), without the
FairScale xformers needed for it."""

from __future__ import annotations

from brickwork.xformers.components.feedforward.base import Feedforward, FeedforwardConfig
from brickwork.xformers.utils import make_registry

FEEDFORWARD_REGISTRY, FEEDFORWARD_CLASS_NAMES, register_feedforward, build_feedforward = make_registry(
    Feedforward, FeedforwardConfig
)


from brickwork.xformers.components.feedforward.mixture_of_experts import (  # noqa: E402
    MixtureOfExperts,
    MoEConfig,
)
from brickwork.xformers.components.feedforward.mlp import (  # noqa: E402
    MLP,
    Conv2DFeedforward,
    ConvMlpConfig,
    FusedMLP,
    MlpConfig,
)

register_feedforward("MLP", MlpConfig)(MLP)
register_feedforward("MixtureOfExperts", MoEConfig)(MixtureOfExperts)
register_feedforward("Conv2DFeedforward", ConvMlpConfig)(Conv2DFeedforward)
register_feedforward("FusedMLP", MlpConfig)(FusedMLP)

__all__ = [
    "FEEDFORWARD_REGISTRY",
    "MLP",
    "Conv2DFeedforward",
    "Feedforward",
    "MixtureOfExperts",
    "build_feedforward",
    "register_feedforward",
]
