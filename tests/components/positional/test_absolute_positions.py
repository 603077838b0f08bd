"""Sinusoidal and learned absolute positions against formulas written here."""

from __future__ import annotations

import math

import pytest
import torch

from brickwork.components.positional import LearnedPositionalEmbedding, SinePositionalEncoding


@pytest.mark.parametrize("dim", [6, 7])
def test_sine_matches_vaswani_formula(dim: int) -> None:
    x = torch.randn(2, 4, dim, dtype=torch.float64)
    out = SinePositionalEncoding(dim)(x, offset=3)
    expected = x.clone()
    for t in range(4):
        pos = t + 3
        for c in range(dim):
            i = c // 2
            angle = pos / 10000 ** (2 * i / dim)
            expected[:, t, c] += math.sin(angle) if c % 2 == 0 else math.cos(angle)
    torch.testing.assert_close(out, expected)


def test_sine_keeps_input_dtype_and_rejects_wrong_width() -> None:
    module = SinePositionalEncoding(8)
    x = torch.zeros(1, 3, 8, dtype=torch.bfloat16)
    assert module(x).dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"\[B, T, 8\].*\(1, 3, 4\)"):
        module(torch.zeros(1, 3, 4))


def test_learned_adds_the_rows_at_the_offset() -> None:
    module = LearnedPositionalEmbedding(max_seq_len=10, dim_model=4)
    assert module.weight.shape == (10, 4)
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(module(x, offset=7), x + module.weight[7:10])


def test_learned_past_the_table_raises_value_error_naming_length_and_max() -> None:
    module = LearnedPositionalEmbedding(max_seq_len=8, dim_model=4)
    with pytest.raises(ValueError, match=r"sequence length 9.*max_seq_len=8"):
        module(torch.zeros(1, 9, 4))
    with pytest.raises(ValueError, match=r"positions up to 10.*offset 6.*max_seq_len=8"):
        module(torch.zeros(1, 4, 4), offset=6)
    with pytest.raises(ValueError, match=r"\[B, T, 4\].*\(1, 2, 3\)"):
        module(torch.zeros(1, 2, 3))
