"""xformers' ``xformers.factory``: block and model configs and builders."""

from brickwork.xformers.factory.block_configs import (
    xFormerBlockConfig,
    xFormerDecoderConfig,
    xFormerEncoderConfig,
)
from brickwork.xformers.factory.block_factory import xFormerDecoderBlock, xFormerEncoderBlock
from brickwork.xformers.factory.model_factory import xFormer, xFormerConfig
from brickwork.xformers.factory.weight_init import xFormerWeightInit

__all__ = [
    "xFormer",
    "xFormerBlockConfig",
    "xFormerConfig",
    "xFormerDecoderBlock",
    "xFormerDecoderConfig",
    "xFormerEncoderBlock",
    "xFormerEncoderConfig",
    "xFormerWeightInit",
]
