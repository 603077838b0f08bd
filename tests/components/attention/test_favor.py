"""FAVOR+ attention: exact linear-attention algebra for its features, and the softmax it approximates."""

import math

import pytest
import torch
from attention_reference import reference_attention

from brickwork.components.attention import FavorAttention
from brickwork.components.attention.favor import orthogonal_features
from brickwork.errors import ConfigError


def _qkv(tq: int = 16, tk: int = 16, d: int = 8, seed: int = 0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    q = 0.5 * torch.randn(2, 2, tq, d, generator=gen, dtype=dtype)
    k = 0.5 * torch.randn(2, 2, tk, d, generator=gen, dtype=dtype)
    v = torch.randn(2, 2, tk, d, generator=gen, dtype=dtype)
    return q, k, v


def _features(x: torch.Tensor, w: torch.Tensor, hyperbolic: bool) -> torch.Tensor:
    """exp(W x - |x|²/2) with x scaled by D^-1/4, without any stabilizer, in float64."""
    x = x.double() * x.shape[-1] ** -0.25
    proj = x @ w.double().T
    if hyperbolic:
        proj = torch.cat([proj, -proj], dim=-1)
    return torch.exp(proj - x.square().sum(-1, keepdim=True) / 2)


@pytest.mark.parametrize("feature_map_type", ["sm_reg", "sm_hyp"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tq,tk", [(6, 6), (3, 7), (5, 3)])
def test_linear_attention_matches_loop(feature_map_type: str, causal: bool, tq: int, tk: int) -> None:
    attention = FavorAttention(dim_head=8, dim_features=16, feature_map_type=feature_map_type, causal=causal)
    q, k, v = _qkv(tq, tk, dtype=torch.float64)
    hyperbolic = feature_map_type == "sm_hyp"
    fq, fk = _features(q, attention.features, hyperbolic), _features(k, attention.features, hyperbolic)
    expected = torch.zeros_like(q)
    for i in range(tq):
        last = i + tk - tq if causal else tk - 1
        if last < 0:
            continue  # a query before every key sees nothing
        weights = torch.einsum("bhm,bhjm->bhj", fq[:, :, i], fk[:, :, : last + 1])
        expected[:, :, i] = (
            torch.einsum("bhj,bhjd->bhd", weights, v[:, :, : last + 1]) / weights.sum(-1)[..., None]
        )
    torch.testing.assert_close(attention.double()(q, k, v), expected)


@pytest.mark.parametrize("feature_map_type", ["sm_reg", "sm_hyp"])
@pytest.mark.parametrize("causal", [False, True])
def test_approximates_softmax_attention(feature_map_type: str, causal: bool) -> None:
    q, k, v = _qkv()
    exact = reference_attention(q, k, v, causal=causal).float()
    errors = []
    for dim_features in (64, 8192):
        attention = FavorAttention(
            dim_head=8, dim_features=dim_features, feature_map_type=feature_map_type, causal=causal, seed=0
        )
        errors.append((attention(q, k, v) - exact).abs().mean().item())
    assert errors[1] < 0.01 < errors[0]


def test_fixed_norm_features_are_close_but_biased() -> None:
    q, k, v = _qkv()
    exact = reference_attention(q, k, v).float()
    error = FavorAttention(dim_head=8, dim_features=8192, feature_map_type="sm_orf", seed=0)(q, k, v) - exact
    assert error.abs().mean() < 0.03


def test_orthogonal_features_are_orthogonal_within_blocks() -> None:
    w = orthogonal_features(12, 8, "sm_orf", torch.Generator().manual_seed(0)).double()
    torch.testing.assert_close(w[:8] @ w[:8].T, 8 * torch.eye(8, dtype=torch.float64), atol=1e-5, rtol=0)
    torch.testing.assert_close(w[8:].norm(dim=-1), torch.full((4,), math.sqrt(8), dtype=torch.float64))


def test_key_padding_matches_dropped_keys() -> None:
    attention = FavorAttention(dim_head=8, dim_features=32, seed=0)
    q, k, v = _qkv()
    keep = torch.ones(2, 1, 1, 16, dtype=torch.bool)
    keep[:, ..., 10:] = False
    torch.testing.assert_close(attention(q, k, v, keep), attention(q, k[:, :, :10], v[:, :, :10]))


def test_redraw_schedule_and_seed() -> None:
    first, second = FavorAttention(dim_head=8, seed=3), FavorAttention(dim_head=8, seed=3)
    assert first.dim_features == 32  # ceil(8 (1 + log2 8)), even
    assert torch.equal(first.features, second.features)
    redrawing = FavorAttention(dim_head=8, iter_before_redraw=2, seed=3)
    q, k, v = _qkv()
    start = redrawing.features.clone()
    redrawing(q, k, v)
    redrawing(q, k, v)
    assert torch.equal(redrawing.features, start)
    redrawing(q, k, v)
    assert not torch.equal(redrawing.features, start)
    assert torch.equal(
        redrawing.features, orthogonal_features(32, 8, "sm_reg", torch.Generator().manual_seed(4))
    )
    redrawing.eval()
    drawn = redrawing.features.clone()
    for _ in range(3):
        redrawing(q, k, v)
    assert torch.equal(redrawing.features, drawn)


def test_half_precision_inputs_stay_finite() -> None:
    q, k, v = (t.to(torch.bfloat16) for t in _qkv())
    out = FavorAttention(dim_head=8, causal=True, seed=0)(q, k, v)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


@pytest.mark.parametrize(
    "options,key",
    [
        ({}, "dim_head"),
        ({"dim_head": 8, "dim_features": 0}, "dim_features"),
        ({"dim_head": 8, "feature_map_type": "relu"}, "feature_map_type"),
        ({"dim_head": 8, "feature_map_type": "sm_hyp", "dim_features": 15}, "dim_features"),
        ({"dim_head": 8, "iter_before_redraw": 0}, "iter_before_redraw"),
        ({"dim_head": 8, "seed": 1.5}, "seed"),
    ],
)
def test_bad_options(options: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        FavorAttention(**options)


def test_wrong_head_dim_raises() -> None:
    q, k, v = _qkv(d=4)
    with pytest.raises(ValueError, match="dim_head=8"):
        FavorAttention(dim_head=8)(q, k, v)
