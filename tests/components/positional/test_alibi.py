"""ALiBi slopes and biases against the paper (Press et al. 2022)."""

from __future__ import annotations

import pytest
import torch

from brickwork.components.positional import ALiBi, alibi_slopes


def test_slopes_for_eight_heads_are_powers_of_one_half() -> None:
    assert alibi_slopes(8) == pytest.approx([2.0**-k for k in range(1, 9)])


def test_slopes_for_twelve_heads_take_eight_then_odd_ones_of_sixteen() -> None:
    # The paper's rule: the 8-head slopes, then every other slope of the 16-head set, 2^(-0.5 * odd).
    expected = [2.0**-k for k in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    assert alibi_slopes(12) == pytest.approx(expected)


def test_slopes_for_sixteen_and_one_heads() -> None:
    assert alibi_slopes(16) == pytest.approx([2.0 ** (-0.5 * k) for k in range(1, 17)])
    assert alibi_slopes(1) == pytest.approx([2.0**-8])


@pytest.mark.parametrize(("tq", "tk"), [(5, 5), (2, 6), (1, 4)])
@pytest.mark.parametrize("symmetric", [False, True])
def test_bias_is_minus_slope_times_distance_bottom_right_aligned(tq: int, tk: int, symmetric: bool) -> None:
    alibi = ALiBi(6, symmetric=symmetric)
    slopes = alibi_slopes(6)
    bias = alibi(tq, tk, "cpu")
    assert bias.shape == (6, tq, tk)
    torch.testing.assert_close(alibi.slopes, torch.tensor(slopes))
    for h in range(6):
        for i in range(tq):
            for j in range(tk):
                distance = (tk - tq + i) - j
                if symmetric:
                    distance = abs(distance)
                assert bias[h, i, j].item() == pytest.approx(-slopes[h] * distance)


def test_last_query_of_a_decode_step_sees_zero_bias_on_itself() -> None:
    bias = ALiBi(4)(1, 7, "cpu")
    assert torch.all(bias[:, 0, -1] == 0)
    assert torch.all(bias[:, 0, :-1] < 0)


def test_bias_follows_a_sharded_slopes_buffer() -> None:
    # A tensor-parallel rank keeps its slice of heads by slicing the `slopes` buffer.
    full = ALiBi(8)
    shard = ALiBi(8)
    shard.slopes = shard.slopes[4:8].clone()
    assert full.tp_divide() == ("num_heads",)
    torch.testing.assert_close(shard(3, 3, "cpu"), full(3, 3, "cpu")[4:8])


@pytest.mark.parametrize(("tq", "tk"), [(0, 3), (2, -1), (2.0, 3)])
def test_bad_lengths_raise_value_error(tq: object, tk: object) -> None:
    with pytest.raises(ValueError, match=r"^(tq|tk) must be a positive integer"):
        ALiBi(2)(tq, tk, "cpu")
