"""Model containers: shapes, causality, padding, KV-cache decoding, tied weights and input checks."""

import pytest
import torch

from brickwork.blocks import DecoderBlock, DecoderLM, Encoder, EncoderBlock, EncoderDecoder, MaskedLMHead
from brickwork.components.attention import MultiHeadAttention
from brickwork.components.feedforward import MLP
from brickwork.components.positional import LearnedPositionalEmbedding, RotaryEmbedding
from brickwork.components.residual import LayerNorm

DIM, HEADS, VOCAB = 32, 4, 50


def _decoder_lm(rotary: bool = False, num_kv_heads: int | None = None) -> DecoderLM:
    layers = [
        DecoderBlock(
            MultiHeadAttention(
                DIM,
                HEADS,
                causal=True,
                num_kv_heads=num_kv_heads,
                rotary=RotaryEmbedding(DIM // HEADS) if rotary else None,
            ),
            MLP(DIM, 64),
        )
        for _ in range(2)
    ]
    position = None if rotary else LearnedPositionalEmbedding(16, DIM)
    return DecoderLM(VOCAB, layers, position=position, final_norm=LayerNorm(DIM), max_seq_len=16).eval()


def _encoder(mlm: bool = False) -> Encoder:
    layers = [EncoderBlock(MultiHeadAttention(DIM, HEADS), MLP(DIM, 64), residual="post") for _ in range(2)]
    head = MaskedLMHead(DIM, VOCAB, LayerNorm(DIM)) if mlm else None
    return Encoder(
        VOCAB,
        layers,
        position=LearnedPositionalEmbedding(16, DIM),
        type_vocab_size=2,
        embedding_norm=LayerNorm(DIM),
        mlm_head=head,
        pooler=True,
    ).eval()


def test_decoder_lm_shapes_and_tied_head() -> None:
    model = _decoder_lm()
    ids = torch.randint(0, VOCAB, (2, 9))
    assert model(ids).shape == (2, 9, VOCAB)
    assert model.lm_head.weight is model.token_embedding.weight
    model(ids).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("rotary", [False, True])
def test_decoder_lm_is_causal(rotary: bool) -> None:
    torch.manual_seed(0)
    model = _decoder_lm(rotary)
    ids = torch.randint(0, VOCAB, (2, 10))
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 7) % VOCAB
    with torch.no_grad():
        a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


@pytest.mark.parametrize("rotary,num_kv_heads", [(False, None), (True, 2)])
def test_kv_cache_decode_equals_full_forward(rotary: bool, num_kv_heads: int | None) -> None:
    torch.manual_seed(0)
    model = _decoder_lm(rotary, num_kv_heads)
    ids = torch.randint(0, VOCAB, (2, 11))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache()
        steps = [model(ids[:, :4], cache=cache)] + [
            model(ids[:, t : t + 1], cache=cache) for t in range(4, 11)
        ]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_generate_matches_greedy_full_forward() -> None:
    torch.manual_seed(0)
    model = _decoder_lm(rotary=True)
    prompt = torch.randint(0, VOCAB, (2, 3))
    out = model.generate(prompt, max_new_tokens=6)
    ids = prompt
    with torch.no_grad():
        for _ in range(6):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, ids)


def test_decoder_lm_input_errors_name_the_value() -> None:
    model = _decoder_lm()
    with pytest.raises(ValueError, match=r"shape \[B, T\], got shape \(2, 3, 4\)"):
        model(torch.zeros(2, 3, 4, dtype=torch.long))
    with pytest.raises(TypeError, match=r"torch\.float32"):
        model(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="max_seq_len=16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_encoder_padding_really_masks() -> None:
    torch.manual_seed(0)
    model = _encoder()
    ids = torch.randint(0, VOCAB, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, 5:] = 0
    other = ids.clone()
    other[0, 5:] = (other[0, 5:] + 3) % VOCAB
    types = torch.randint(0, 2, (2, 8))
    with torch.no_grad():
        a = model(ids, attention_mask=mask, token_type_ids=types)
        b = model(other, attention_mask=mask, token_type_ids=types)
    torch.testing.assert_close(a[0, :5], b[0, :5])
    torch.testing.assert_close(a[1], b[1])
    assert model.pool(a).shape == (2, DIM)


def test_encoder_mlm_head_is_tied() -> None:
    model = _encoder(mlm=True)
    assert model.mlm_head.decoder.weight is model.token_embedding.weight
    assert model(torch.randint(0, VOCAB, (2, 5))).shape == (2, 5, VOCAB)
    with pytest.raises(ValueError, match=r"\(2, 4\)"):
        model(torch.zeros(2, 5, dtype=torch.long), attention_mask=torch.ones(2, 4))


def test_encoder_decoder_masks_source_padding() -> None:
    torch.manual_seed(0)
    enc = [EncoderBlock(MultiHeadAttention(DIM, HEADS), MLP(DIM, 64)) for _ in range(2)]
    dec = [
        DecoderBlock(
            MultiHeadAttention(DIM, HEADS, causal=True),
            MLP(DIM, 64),
            cross_attention=MultiHeadAttention(DIM, HEADS),
        )
        for _ in range(2)
    ]
    model = EncoderDecoder(VOCAB, enc, dec, position=LearnedPositionalEmbedding(16, DIM)).eval()
    src, tgt = torch.randint(0, VOCAB, (2, 7)), torch.randint(0, VOCAB, (2, 5))
    src_mask = torch.ones(2, 7)
    src_mask[1, 4:] = 0
    other = src.clone()
    other[1, 4:] = (other[1, 4:] + 1) % VOCAB
    with torch.no_grad():
        a, b = model(src, tgt, src_mask), model(other, tgt, src_mask)
    assert a.shape == (2, 5, VOCAB)
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match=r"src_mask must have the shape of the ids \(2, 7\)"):
        model.decode(tgt, model.encode(src), src_mask[:, :5])
    with pytest.raises(ValueError, match="cross_attention"):
        EncoderDecoder(VOCAB, enc, [DecoderBlock(MultiHeadAttention(DIM, HEADS), MLP(DIM, 64))])


def test_decoder_lm_padding_mask_covers_cache() -> None:
    torch.manual_seed(0)
    model = _decoder_lm(rotary=True)
    ids = torch.randint(0, VOCAB, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, :3] = 0  # left padding
    other = ids.clone()
    other[0, :3] = (other[0, :3] + 5) % VOCAB
    with torch.no_grad():
        a, b = model(ids, attention_mask=mask), model(other, attention_mask=mask)
        cache = model.new_cache()
        steps = [model(ids[:, :5], attention_mask=mask[:, :5], cache=cache)]
        steps += [model(ids[:, t : t + 1], attention_mask=mask[:, : t + 1], cache=cache) for t in range(5, 8)]
    torch.testing.assert_close(a[0, 3:], b[0, 3:])
    torch.testing.assert_close(torch.cat(steps, dim=1)[:, 3:], a[:, 3:], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"attention_mask must have the shape"):
        model(ids, attention_mask=mask[:, :4])
