"""``positions`` [B, T] (HF's ``position_ids``) give each row the positions an ``offset`` gives it
alone: what a left-padded row needs to start at 0."""

from __future__ import annotations

import pytest
import torch

from brickwork.components.positional import POSITIONAL_REGISTRY

ADDITIVE = {"sine": {"dim_model": 12}, "learned": {"max_seq_len": 20, "dim_model": 12}}


@pytest.mark.parametrize("name", ADDITIVE)
def test_additive_positions_are_each_rows_offset(name: str) -> None:
    torch.manual_seed(0)
    module = POSITIONAL_REGISTRY.build(name, "position", **ADDITIVE[name])
    x = torch.randn(2, 5, 12)
    positions = torch.stack([torch.arange(3, 8), torch.arange(0, 5)])
    got = module(x, positions=positions)
    torch.testing.assert_close(got[0], module(x[:1], offset=3)[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], module(x[1:], offset=0)[0], rtol=0, atol=0)


def test_rotary_positions_are_each_rows_offset() -> None:
    rotary = POSITIONAL_REGISTRY.build("rotary", "position", dim_head=8, max_seq_len=6)
    q, k = torch.randn(2, 3, 4, 8), torch.randn(2, 1, 4, 8)
    positions = torch.stack([torch.arange(5, 9), torch.arange(0, 4)])  # row 0 runs past the table
    got_q, got_k = rotary(q, k, positions=positions)
    for row, offset in ((0, 5), (1, 0)):
        want_q, want_k = rotary(q[row : row + 1], k[row : row + 1], offset=offset)
        torch.testing.assert_close(got_q[row], want_q[0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got_k[row], want_k[0], rtol=1e-6, atol=1e-6)


def test_positions_of_another_length_or_outside_the_table_are_refused() -> None:
    learned = POSITIONAL_REGISTRY.build("learned", "position", max_seq_len=4, dim_model=12)
    with pytest.raises(ValueError, match=r"positions must be \[B, T=3\]"):
        learned(torch.randn(1, 3, 12), positions=torch.arange(4)[None])
    with pytest.raises(ValueError, match=r"position 4 is outside the learned position table"):
        learned(torch.randn(1, 3, 12), positions=torch.tensor([[2, 3, 4]]))
