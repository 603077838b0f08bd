"""Encoder and decoder blocks, and the model containers built from stacks of them."""

from brickwork.blocks.block import Block, DecoderBlock, EncoderBlock
from brickwork.blocks.decoder_lm import DecoderLM
from brickwork.blocks.encoder import Encoder
from brickwork.blocks.encoder_decoder import EncoderDecoder
from brickwork.blocks.heads import MaskedLMHead, Pooler
from brickwork.blocks.image_encoder import ImageEncoder, PatchEmbedding
from brickwork.blocks.model_kind import ModelKind
from brickwork.blocks.models import MODELS
from brickwork.blocks.output import IGNORE_INDEX, LossOutput, shift_labels

__all__ = [
    "IGNORE_INDEX",
    "MODELS",
    "Block",
    "DecoderBlock",
    "DecoderLM",
    "Encoder",
    "EncoderBlock",
    "EncoderDecoder",
    "ImageEncoder",
    "LossOutput",
    "MaskedLMHead",
    "ModelKind",
    "PatchEmbedding",
    "Pooler",
    "shift_labels",
]
