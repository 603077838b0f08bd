"""Values no model can take fail with a ValueError naming the value, not deep inside a layer: an id
outside the vocabulary, a padding mask that is not 0/1, a sampling temperature that is not a number,
and a seed no generator holds (a ConfigError naming ``train.seed``)."""

from __future__ import annotations

import math

import pytest
import torch
from test_models import DIM, HEADS, VOCAB, _decoder_lm, _encoder

from brickwork.blocks import DecoderBlock, EncoderBlock, EncoderDecoder
from brickwork.components.attention import MultiHeadAttention
from brickwork.components.feedforward import MLP
from brickwork.errors import ConfigError
from brickwork.train.run_config import resolve_run


@pytest.mark.parametrize("bad", [VOCAB, VOCAB + 250, -1, -100])
def test_an_id_outside_the_vocabulary_is_named(bad: int) -> None:
    ids = torch.randint(0, VOCAB, (2, 6))
    ids[1, 3] = bad
    message = rf"input_ids holds the id {bad}, outside the vocabulary \[0, {VOCAB}\)"
    with pytest.raises(ValueError, match=message):
        _decoder_lm()(ids)
    with pytest.raises(ValueError, match=message):
        _encoder(mlm=True)(ids)
    with pytest.raises(ValueError, match=r"token_type_ids holds the id 2, outside the vocabulary \[0, 2\)"):
        _encoder()(torch.zeros_like(ids), token_type_ids=torch.full_like(ids, 2))


def test_an_id_outside_the_vocabulary_of_an_encoder_decoder_is_named() -> None:
    enc = [EncoderBlock(MultiHeadAttention(DIM, HEADS), MLP(DIM, 64))]
    dec = [DecoderBlock(MultiHeadAttention(DIM, HEADS, causal=True), MLP(DIM, 64),
                        cross_attention=MultiHeadAttention(DIM, HEADS))]  # fmt: skip
    model = EncoderDecoder(VOCAB, enc, dec)
    src, tgt = torch.randint(0, VOCAB, (2, 5)), torch.randint(0, VOCAB, (2, 4))
    with pytest.raises(ValueError, match=rf"tgt_ids holds the id {VOCAB}"):
        model(src, torch.where(tgt == tgt[0, 0], VOCAB, tgt))


@pytest.mark.parametrize("bad", [0.5, 2.0, -1.0, math.nan])
def test_a_padding_mask_other_than_zero_and_one_is_named(bad: float) -> None:
    mask = torch.ones(2, 6)
    mask[0, 4] = bad
    with pytest.raises(
        ValueError, match=rf"attention_mask must hold 1 \(real token\) and 0 \(padding\), got {bad}"
    ):
        _encoder()(torch.randint(0, VOCAB, (2, 6)), attention_mask=mask)


def test_zero_one_masks_of_every_dtype_and_bool_masks_still_work() -> None:
    model, ids = _encoder(), torch.randint(0, VOCAB, (2, 6))
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        expected = model(ids, attention_mask=mask.bool())
        for dtype in (torch.long, torch.int32, torch.float32, torch.float16):
            torch.testing.assert_close(model(ids, attention_mask=mask.to(dtype)), expected)


@pytest.mark.parametrize("temperature", [math.nan, math.inf, -0.5])
def test_a_temperature_that_is_not_a_finite_non_negative_number_is_named(temperature: float) -> None:
    with pytest.raises(
        ValueError, match=rf"temperature: must be a finite number >= 0 \(0 = greedy\), got {temperature}"
    ):
        _decoder_lm().generate(torch.zeros(1, 3, dtype=torch.long), 4, temperature=temperature)


def test_a_seed_no_generator_holds_is_named() -> None:
    with pytest.raises(ConfigError, match=rf"train\.seed: must be below 2\*\*63, got {2**70}"):
        resolve_run("gpt-tiny", [f"train.seed={2**70}"])
    assert resolve_run("gpt-tiny", [f"train.seed={2**63 - 1}"]).train.seed == 2**63 - 1


def test_a_block_refuses_cross_attention_that_cannot_take_memory_when_built() -> None:
    attention = MultiHeadAttention(DIM, HEADS)
    with pytest.raises(ConfigError, match=r"^cross_attention\.fused_qkv: .*separate q/k/v"):
        DecoderBlock(attention, MLP(DIM), cross_attention=MultiHeadAttention(DIM, HEADS, fused_qkv=True))
    mixer = MultiHeadAttention(DIM, HEADS, attention="fourier_mix")
    with pytest.raises(ConfigError, match=r"^cross_attention\.attention: FourierMix .*cannot attend"):
        DecoderBlock(attention, MLP(DIM), cross_attention=mixer)
