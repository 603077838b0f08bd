"""Feedforward family: MLP, gated linear units (GLU, SwiGLU, GeGLU) and mixture of experts, and the
convolutional MLP of vision backbones."""

from .activations import ACTIVATIONS, FunctionActivation, SquaredReLU, create_activation
from .base import FEEDFORWARD_REGISTRY, Feedforward, register_feedforward
from .conv_mlp import ConvMLP
from .glu import GLU, GeGLU, SwiGLU, default_glu_hidden_dim
from .mlp import MLP
from .moe import MixtureOfExperts

__all__ = [
    "ACTIVATIONS",
    "FEEDFORWARD_REGISTRY",
    "GLU",
    "MLP",
    "ConvMLP",
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
