"""Positional family: sinusoidal and learned absolute positions, rotary embedding (+ scaling), ALiBi."""

from .alibi import ALiBi, alibi_slopes
from .base import POSITIONAL_REGISTRY, PositionalEncoding, register_positional
from .learned import LearnedPositionalEmbedding
from .rotary import RotaryEmbedding
from .rotary_scaling import SCALING_OPTIONS, check_scaling, rotary_inv_freq
from .sine import SinePositionalEncoding, sinusoidal_table

__all__ = [
    "POSITIONAL_REGISTRY",
    "SCALING_OPTIONS",
    "ALiBi",
    "LearnedPositionalEmbedding",
    "PositionalEncoding",
    "RotaryEmbedding",
    "SinePositionalEncoding",
    "alibi_slopes",
    "check_scaling",
    "register_positional",
    "rotary_inv_freq",
    "sinusoidal_table",
]
