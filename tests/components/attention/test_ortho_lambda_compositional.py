"""Orthoformer, the lambda layer and compositional attention against formulas written in the test."""

import pytest
import torch
from attention_reference import reference_attention

from brickwork.components.attention import CompositionalAttention, LambdaLayer, OrthoformerAttention
from brickwork.components.attention.ortho import orthogonal_landmarks
from brickwork.errors import ConfigError


def _qkv(t: int = 12, d: int = 8, heads: int = 2):
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, heads, t, d, generator=gen, dtype=torch.float64) for _ in range(3))


def test_ortho_is_two_softmaxes_through_the_picked_keys() -> None:
    q, k, v = _qkv()
    attention = OrthoformerAttention(num_landmarks=4)
    index = orthogonal_landmarks(k, 4)
    landmarks = torch.stack([k[b, h, index[b, h]] for b in range(2) for h in range(2)]).view(2, 2, 4, 8)
    scale = 8**-0.5
    expected = torch.softmax(q @ landmarks.mT * scale, -1) @ (torch.softmax(landmarks @ k.mT * scale, -1) @ v)
    torch.testing.assert_close(attention(q, k, v), expected)
    # The picks: no key twice, the longest first, and exact attention when every key is a landmark.
    assert all(len(set(row.tolist())) == 4 for row in index.flatten(0, 1))
    assert torch.equal(index[..., 0], k.norm(dim=-1).argmax(dim=-1))
    torch.testing.assert_close(OrthoformerAttention(num_landmarks=12)(q, k, v), reference_attention(q, k, v))
    with pytest.raises(ConfigError, match="subsample_fraction"):
        OrthoformerAttention(subsample_fraction=1.5)


def test_orthogonal_keys_are_found() -> None:
    # Eight keys along two axes: after the longest one, the next pick is the orthogonal axis.
    k = torch.zeros(1, 1, 8, 4, dtype=torch.float64)
    k[0, 0, :4, 0] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    k[0, 0, 4:, 1] = 1.0
    assert orthogonal_landmarks(k, 2)[0, 0].tolist()[:1] == [3] and orthogonal_landmarks(k, 2)[0, 0, 1] >= 4


def test_lambda_layer_matches_its_definition() -> None:
    q, k, v = _qkv(t=6)
    layer = LambdaLayer(seq_len=8, dim_head=8).double()
    e = layer.relative_embedding.detach()
    out = torch.zeros_like(q)
    for n in range(6):
        content = torch.softmax(k, dim=-2).mT @ v  # (B, H, D, D)
        position = sum(e[n - m + 7][:, None] * v[..., m, None, :] for m in range(6))  # (B, H, D, D)
        out[..., n, :] = (q[..., n, None, :] @ (content + position)).squeeze(-2)
    torch.testing.assert_close(layer(q, k, v), out)
    with pytest.raises(ValueError, match="exceeds seq_len=8"):
        layer(*_qkv(t=9))
    with pytest.raises(ConfigError, match="seq_len"):
        LambdaLayer(dim_head=8)


def test_compositional_searches_every_rule_then_selects() -> None:
    q, k, v = _qkv()
    layer = CompositionalAttention(num_heads=2, dim_head=8, num_rules=3, causal=True).double()
    rules = torch.einsum("bhtd,hr->brtd", v, layer.rule_mix.detach())
    outs = []
    for s in range(2):
        retrieved = torch.stack(
            [
                reference_attention(q[:, s : s + 1], k[:, s : s + 1], rules[:, r : r + 1], causal=True)[:, 0]
                for r in range(3)
            ],
            dim=1,
        )  # fmt: skip  (B, R, T, D)
        query = layer.selection_query(q[:, s])[:, None]
        choice = torch.softmax((query * layer.selection_key(retrieved)).sum(-1) / 8**0.5, dim=1)
        outs.append((choice[..., None] * retrieved).sum(1))
    torch.testing.assert_close(layer(q, k, v), torch.stack(outs, dim=1))
