"""Encoder and decoder blocks, and the model containers built from stacks of them."""

from brickwork.blocks.block import Block, DecoderBlock, EncoderBlock
from brickwork.blocks.decoder_lm import DecoderLM, LMLoss
from brickwork.blocks.encoder import Encoder
from brickwork.blocks.encoder_decoder import EncoderDecoder
from brickwork.blocks.heads import MaskedLMHead, Pooler
from brickwork.blocks.image_encoder import ImageEncoder, PatchEmbedding

__all__ = [
    "Block",
    "DecoderBlock",
    "DecoderLM",
    "Encoder",
    "EncoderBlock",
    "EncoderDecoder",
    "ImageEncoder",
    "LMLoss",
    "MaskedLMHead",
    "PatchEmbedding",
    "Pooler",
]
