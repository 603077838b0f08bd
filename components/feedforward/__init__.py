"""Feedforward family: MLP, gated linear units (GLU, SwiGLU, GeGLU) and mixture of experts."""

from .activations import ACTIVATIONS, FunctionActivation, SquaredReLU, create_activation
from .base import FEEDFORWARD_REGISTRY, Feedforward, register_feedforward
from .glu import GLU, GeGLU, SwiGLU, default_glu_hidden_dim
from .mlp import MLP
from .moe import MixtureOfExperts

__all__ = [
    "ACTIVATIONS",
    "FEEDFORWARD_REGISTRY",
    "GLU",
    "MLP",
    "Feedforward",
    "FunctionActivation",
    "GeGLU",
    "MixtureOfExperts",
    "SquaredReLU",
    "SwiGLU",
    "create_activation",
    "default_glu_hidden_dim",
    "register_feedforward",
]
