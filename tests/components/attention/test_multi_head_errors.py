"""MultiHeadAttention refuses bad options and inputs with errors that name the problem."""

import pytest
import torch

from brickwork.components.attention import MultiHeadAttention, ScaledDotProduct
from brickwork.errors import ConfigError


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"dim_model": 10, "num_heads": 4}, "dim_model=10 is not divisible by num_heads=4"),
        (
            {"dim_model": 16, "num_heads": 4, "num_kv_heads": 3},
            "num_heads=4 must be a multiple of num_kv_heads=3",
        ),
        ({"dim_model": 0, "num_heads": 4}, "dim_model"),
        ({"dim_model": 16, "num_heads": 4, "dim_head": 0}, "dim_head"),
        ({"dim_model": 16, "num_heads": 4, "dropout": 1.0}, "dropout"),
        ({"dim_model": 16, "num_heads": 4, "fused_qkv": "yes"}, "fused_qkv"),
        (
            {"dim_model": 16, "num_heads": 4, "attention": "scaled_dot_prodcut"},
            "did you mean 'scaled_dot_product'",
        ),
        ({"dim_model": 16, "num_heads": 4, "attention": 3}, "attention"),
        ({"dim_model": 16, "num_heads": 4, "attention_options": {"windw": 3}}, r"attention_options\.windw"),
        ({"dim_model": 16, "num_heads": 4, "attention_options": ["causal"]}, "attention_options"),
        ({"dim_model": 16, "num_heads": 4, "attention": "linformer", "causal": True}, "no causal form"),
        (
            {"dim_model": 16, "num_heads": 4, "causal": True, "attention_options": {"causal": False}},
            "conflicts with causal=True",
        ),
        (
            {"dim_model": 16, "num_heads": 4, "attention": "favor", "attention_options": {"dim_head": 8}},
            "dim_head",
        ),
        (
            {
                "dim_model": 16,
                "num_heads": 4,
                "attention": ScaledDotProduct(),
                "attention_options": {"dropout": 0.1},
            },
            "attention_options",
        ),
        ({"dim_model": 16, "num_heads": 4, "attention": ScaledDotProduct(), "causal": True}, "not causal"),
        (
            {
                "dim_model": 16,
                "num_heads": 4,
                "attention": "linformer",
                "attention_options": {"seq_len": 8},
                "position_bias": lambda tq, tk, device=None: torch.zeros(4, tq, tk),
            },
            "position_bias",
        ),
    ],
)
def test_bad_options_raise_config_error(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        MultiHeadAttention(**kwargs)


def test_unknown_option_lists_the_allowed_ones() -> None:
    with pytest.raises(ConfigError, match="allowed: backend, causal, dropout, window_size"):
        MultiHeadAttention(16, 4, attention="local", attention_options={"window": 3})


def test_bad_inputs_raise_value_error() -> None:
    layer = MultiHeadAttention(16, 4)
    with pytest.raises(ValueError, match=r"x must be \[B, T, dim_model=16\], got shape \(5, 16\)"):
        layer(torch.randn(5, 16))
    with pytest.raises(ValueError, match=r"got shape \(2, 5, 12\)"):
        layer(torch.randn(2, 5, 12))
    with pytest.raises(ValueError, match="memory"):
        layer(torch.randn(2, 5, 16), memory=torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match="memory batch 3"):
        layer(torch.randn(2, 5, 16), memory=torch.randn(3, 5, 16))
    with pytest.raises(ValueError, match="does not broadcast"):
        layer(torch.randn(2, 5, 16), attn_mask=torch.ones(2, 1, 1, 4, dtype=torch.bool))


def test_cross_attention_needs_separate_projections_and_no_rotary() -> None:
    x = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match="fused_qkv=False"):
        MultiHeadAttention(16, 4, fused_qkv=True)(x, memory=x)
    rotary = MultiHeadAttention(16, 4, rotary=lambda q, k, offset=0: (q, k))
    with pytest.raises(ValueError, match="rotary applies to self-attention"):
        rotary(x, memory=x)
