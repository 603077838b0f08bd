"""``MODELS``: every model kind by name (blocks/model_kind.py says what a kind holds)."""

from brickwork.blocks.decoder_lm import DECODER_LM
from brickwork.blocks.encoder import ENCODER
from brickwork.blocks.encoder_decoder import ENCODER_DECODER
from brickwork.blocks.image_encoder import IMAGE_ENCODER
from brickwork.blocks.model_kind import ModelKind

MODELS: dict[str, ModelKind] = {
    "decoder_lm": DECODER_LM,
    "encoder": ENCODER,
    "encoder_decoder": ENCODER_DECODER,
    "image_encoder": IMAGE_ENCODER,
}
