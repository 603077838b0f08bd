"""DeepNorm coefficients against the DeepNet paper, and the beta initialisation on real components."""

from __future__ import annotations

import math

import pytest
import torch

from brickwork.components.feedforward import GLU, MLP, MixtureOfExperts
from brickwork.components.residual import DeepNormResidual, deepnorm_coefficients, deepnorm_init_
from brickwork.errors import ConfigError


@pytest.mark.parametrize(
    ("n", "m", "part", "alpha", "beta"),
    [
        (8, 0, None, 2.0, 1 / (2 * math.sqrt(2))),  # encoder-only: (2N)^(1/4), (8N)^(-1/4)
        (0, 2, "decoder", math.sqrt(2), 0.5),  # decoder-only: (2M)^(1/4), (8M)^(-1/4)
        (1, 1, "encoder", 0.81, 0.87),  # encoder of enc-dec: 0.81 (N^4 M)^(1/16), 0.87 (N^4 M)^(-1/16)
        (2, 1, "encoder", 0.81 * 2**0.25, 0.87 * 2**-0.25),
        (1, 1, "decoder", 3**0.25, 12**-0.25),  # decoder of enc-dec: (3M)^(1/4), (12M)^(-1/4)
        (6, 18, "decoder", 54**0.25, 216**-0.25),
    ],
)
def test_coefficients_follow_the_paper(n: int, m: int, part: str | None, alpha: float, beta: float) -> None:
    assert deepnorm_coefficients(n, m, part) == pytest.approx((alpha, beta))
    style = DeepNormResidual(num_encoder_layers=n, num_decoder_layers=m, part=part)
    assert (style.alpha, style.beta) == pytest.approx((alpha, beta))


def test_explicit_alpha_and_beta() -> None:
    style = DeepNormResidual(alpha=3.0)
    assert (style.alpha, style.beta) == (3.0, 1.0)
    assert DeepNormResidual(alpha=3.0, beta=0.5).beta == 0.5


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({}, "alpha"),
        ({"alpha": -1.0}, "alpha"),
        ({"alpha": 2.0, "num_decoder_layers": 4}, "alpha"),
        ({"num_encoder_layers": 3, "num_decoder_layers": 3}, "part"),
        ({"num_decoder_layers": 3, "part": "encoder"}, "part"),
        ({"num_decoder_layers": 3, "part": "decoderr"}, "did you mean 'decoder'"),
        ({"num_decoder_layers": -1}, "num_decoder_layers"),
    ],
)
def test_bad_options(options: dict, option: str) -> None:
    with pytest.raises(ConfigError, match=option):
        DeepNormResidual(**options)


def attention(fused: bool) -> torch.nn.Module:
    mha = pytest.importorskip("brickwork.components.attention").MultiHeadAttention
    return mha(dim_model=16, num_heads=4, num_kv_heads=2, bias=False, fused_qkv=fused)


@pytest.mark.parametrize("fused", [False, True])
def test_init_scales_values_and_output_so_attention_output_scales_by_beta_squared(fused: bool) -> None:
    torch.manual_seed(0)
    mha = attention(fused)
    x = torch.randn(2, 5, 16)
    before = mha(x)
    scaled = deepnorm_init_(mha, 0.5)
    # Queries and keys untouched keep the attention pattern; values and output each carry beta.
    torch.testing.assert_close(mha(x), 0.25 * before)
    assert scaled == (["qkv_proj (value rows)", "out_proj"] if fused else ["v_proj", "out_proj"])


def test_init_scales_every_feedforward_projection_but_not_routers() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    mlp = MLP(8, activation="relu", bias=False)
    before = mlp(x)
    deepnorm_init_(mlp, 0.5)
    torch.testing.assert_close(mlp(x), 0.25 * before)
    glu = GLU(8, activation="relu")
    before = glu(x)
    deepnorm_init_(glu, 0.5)
    torch.testing.assert_close(glu(x), 0.125 * before)
    moe = MixtureOfExperts(8, num_experts=2, top_k=1)
    router = moe.router.weight.clone()
    scaled = deepnorm_init_(moe, 0.5)
    torch.testing.assert_close(moe.router.weight, router)
    assert scaled == [f"experts.{e}.{p}" for e in range(2) for p in ("up_proj", "down_proj")]
