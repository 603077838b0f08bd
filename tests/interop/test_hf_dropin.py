"""docs/dropin.md, tested: brickwork attention inside HF GPT-2, HF BERT and torch's encoder layer."""

import pytest
import torch
import transformers
from hf_models import VOCAB, assert_close, hf_model
from torch import nn

from brickwork.components.attention import ATTENTION_REGISTRY
from brickwork.factory.hf.dropin import (
    BertAttentionAdapter,
    GPT2AttentionAdapter,
    TorchAttentionAdapter,
    bert_attention,
    gpt2_attention,
    torch_attention,
)


def _ids(batch: int = 2, length: int = 12) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(5))


def test_gpt2_with_brickwork_attention() -> None:
    model = hf_model("gpt2")
    ids = _ids()
    with torch.no_grad():
        before = model(ids, use_cache=False).logits
        for block in model.transformer.h:
            block.attn = GPT2AttentionAdapter(gpt2_attention(block.attn))
        after = model(ids, use_cache=False).logits
    assert_close(after, before)

    # Swap the mechanism: a causal window reaching 3 keys back leaves positions 0..3 as they were.
    for block in model.transformer.h:
        mha = block.attn.attention
        mha.mechanism = ATTENTION_REGISTRY.build("local", causal=True, window_size=6)
    with torch.no_grad():
        local = model(ids, use_cache=False).logits
    assert_close(local[:, :4], before[:, :4])
    assert (local[:, 6:] - before[:, 6:]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="use_cache=False"):
        model(ids)


def test_bert_with_brickwork_attention_and_padding() -> None:
    model = hf_model("bert", model_class=transformers.BertModel)
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[0, 8:] = 0
    with torch.no_grad():
        before = model(ids, attention_mask=mask).last_hidden_state
        for layer in model.encoder.layer:
            old = layer.attention
            layer.attention = BertAttentionAdapter(
                bert_attention(old), old.output.LayerNorm, old.output.dropout
            )
        after = model(ids, attention_mask=mask).last_hidden_state
    assert_close(after, before)


@pytest.mark.parametrize("norm_first", [False, True])
def test_torch_encoder_layer_with_brickwork_attention(norm_first: bool) -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(24, 4, 40, dropout=0.0, batch_first=True, norm_first=norm_first)
    encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    x = torch.randn(3, 10, 24)
    pad = torch.zeros(3, 10, dtype=torch.bool)
    pad[1, 7:] = True
    causal = nn.Transformer.generate_square_subsequent_mask(10)
    with torch.no_grad():
        before = encoder(x, src_key_padding_mask=pad)
        before_causal = encoder(x, mask=causal, is_causal=True)
        for sub in encoder.layers:
            sub.self_attn = TorchAttentionAdapter(torch_attention(sub.self_attn))
        after = encoder(x, src_key_padding_mask=pad)
        after_causal = encoder(x, mask=causal, is_causal=True)
    assert_close(after, before)
    assert_close(after_causal, before_causal)


def test_adapters_refuse_what_they_cannot_do() -> None:
    mha = nn.MultiheadAttention(8, 2, batch_first=True, add_bias_kv=True)
    with pytest.raises(ValueError, match="add_bias_kv"):
        torch_attention(mha)
    adapter = TorchAttentionAdapter(torch_attention(nn.MultiheadAttention(8, 2, batch_first=True)))
    x, y = torch.randn(1, 3, 8), torch.randn(1, 3, 8)
    with pytest.raises(ValueError, match="self-attention"):
        adapter(x, y, y)
