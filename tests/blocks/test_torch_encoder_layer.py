"""EncoderBlock against torch.nn.TransformerEncoderLayer carrying the same weights."""

import pytest
import torch
from torch import nn

from brickwork.blocks import EncoderBlock
from brickwork.components.attention import MultiHeadAttention
from brickwork.components.feedforward import MLP

DIM, HEADS, HIDDEN = 24, 4, 40


def _copy_weights(block: EncoderBlock, layer: nn.TransformerEncoderLayer) -> None:
    q, k, v = layer.self_attn.in_proj_weight.chunk(3)
    qb, kb, vb = layer.self_attn.in_proj_bias.chunk(3)
    pairs = [
        (block.attention.q_proj.weight, q),
        (block.attention.q_proj.bias, qb),
        (block.attention.k_proj.weight, k),
        (block.attention.k_proj.bias, kb),
        (block.attention.v_proj.weight, v),
        (block.attention.v_proj.bias, vb),
        (block.attention.out_proj.weight, layer.self_attn.out_proj.weight),
        (block.attention.out_proj.bias, layer.self_attn.out_proj.bias),
        (block.feedforward.up_proj.weight, layer.linear1.weight),
        (block.feedforward.up_proj.bias, layer.linear1.bias),
        (block.feedforward.down_proj.weight, layer.linear2.weight),
        (block.feedforward.down_proj.bias, layer.linear2.bias),
        (block.attention_norm.weight, layer.norm1.weight),
        (block.attention_norm.bias, layer.norm1.bias),
        (block.feedforward_norm.weight, layer.norm2.weight),
        (block.feedforward_norm.bias, layer.norm2.bias),
    ]
    with torch.no_grad():
        for ours, theirs in pairs:
            ours.copy_(theirs)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_encoder_block_matches_torch_encoder_layer(norm_first: bool, activation: str) -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(
        DIM, HEADS, HIDDEN, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    ).eval()
    with torch.no_grad():  # norms start at 1/0, which would hide a swapped mapping
        for p in layer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    block = EncoderBlock(
        MultiHeadAttention(DIM, HEADS),
        MLP(DIM, HIDDEN, activation=activation),
        norm="layernorm",
        residual="pre" if norm_first else "post",
    ).eval()
    _copy_weights(block, layer)

    x = torch.randn(3, 7, DIM)
    keep = torch.ones(3, 7, dtype=torch.bool)
    keep[1, 5:] = False
    keep[2, 3:] = False
    with torch.no_grad():
        expected = layer(x, src_key_padding_mask=~keep)
        got = block(x, attn_mask=keep[:, None, None, :])
    # torch's fast path returns zeros at padded positions; compare the real tokens.
    torch.testing.assert_close(got[keep], expected[keep], atol=1e-5, rtol=1e-5)
