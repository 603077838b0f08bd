"""Residual styles (pre, post, deepnorm, parallel) and the norms (LayerNorm, RMSNorm)."""

from .base import RESIDUAL_REGISTRY, ResidualStyle, register_residual
from .deepnorm import DeepNormResidual, deepnorm_coefficients, deepnorm_init_
from .norms import NORM_REGISTRY, LayerNorm, RMSNorm, register_norm
from .styles import ParallelResidual, PostNormResidual, PreNormResidual

__all__ = [
    "NORM_REGISTRY",
    "RESIDUAL_REGISTRY",
    "DeepNormResidual",
    "LayerNorm",
    "ParallelResidual",
    "PostNormResidual",
    "PreNormResidual",
    "RMSNorm",
    "ResidualStyle",
    "deepnorm_coefficients",
    "deepnorm_init_",
    "register_norm",
    "register_residual",
]
