"""Encoder and decoder blocks, the model containers built from stacks of them, their weight init
schemes, and ``summary``."""

from brickwork.blocks.block import Block, DecoderBlock, EncoderBlock
from brickwork.blocks.decoder_lm import DecoderLM
from brickwork.blocks.encoder import Encoder
from brickwork.blocks.encoder_decoder import EncoderDecoder
from brickwork.blocks.heads import MaskedLMHead, Pooler
from brickwork.blocks.image_encoder import ImageEncoder, PatchEmbedding
from brickwork.blocks.initialization import INIT_REGISTRY, InitScheme, init_model, register_init
from brickwork.blocks.model_kind import ModelKind
from brickwork.blocks.models import MODELS
from brickwork.blocks.output import IGNORE_INDEX, LossOutput, shift_labels
from brickwork.blocks.summary import summary

__all__ = [
    "IGNORE_INDEX",
    "INIT_REGISTRY",
    "MODELS",
    "Block",
    "DecoderBlock",
    "DecoderLM",
    "Encoder",
    "EncoderBlock",
    "EncoderDecoder",
    "ImageEncoder",
    "InitScheme",
    "LossOutput",
    "MaskedLMHead",
    "ModelKind",
    "PatchEmbedding",
    "Pooler",
    "init_model",
    "register_init",
    "shift_labels",
    "summary",
]
