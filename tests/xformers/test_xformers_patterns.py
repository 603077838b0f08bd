"""xformers' attention patterns and block-sparsity layouts (ported from its test_attention_patterns),
against references written here."""

from __future__ import annotations

import itertools

import pytest
import torch

import brickwork.xformers.components.attention.attention_patterns as AP
from brickwork.xformers.components.attention.sparsity_config import (
    BigBirdSparsityConfig,
    BSLongformerSparsityConfig,
    DenseSparsityConfig,
    FixedSparsityConfig,
    VariableSparsityConfig,
)


def _coords(h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    i, j = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    return i.reshape(-1).float(), j.reshape(-1).float()


def _pairwise(points: torch.Tensor, p: float) -> torch.Tensor:
    """Minkowski distances by brute force over every pair (p=0 counts differing coordinates)."""
    diff = (points[:, None, :] - points[None, :, :]).abs()
    if p == 0:
        return (diff != 0).sum(-1).float()
    return (diff**p).sum(-1) ** (1 / p)


@pytest.mark.parametrize("window_size", [3, 7, 11])
@pytest.mark.parametrize("attn_size", [50, 51, 64])
def test_local_1d_pattern(attn_size: int, window_size: int) -> None:
    full = torch.ones(attn_size, attn_size, dtype=torch.bool)
    half = window_size // 2
    ref = torch.tril(full, diagonal=half) & ~torch.tril(full, diagonal=-(half + 1))
    assert torch.equal(AP.local_1d_pattern(attn_size, window_size), ref)


@pytest.mark.parametrize("p", [0, 1, 2])
@pytest.mark.parametrize("W", [5, 7, 10])
@pytest.mark.parametrize("H", [5, 7, 10])
def test_2d_distances(H: int, W: int, p: int) -> None:
    i, j = _coords(H, W)
    torch.testing.assert_close(AP.horizontal_axial_2d_distance(H, W, p=p), _pairwise(i[:, None], p))
    torch.testing.assert_close(AP.vertical_axial_2d_distance(H, W, p=p), _pairwise(j[:, None], p))
    torch.testing.assert_close(AP.local_2d_distance(H, W, p=p), _pairwise(torch.stack([i, j], 1), p))


@pytest.mark.parametrize("sigma", [0.5, 1, 2])
@pytest.mark.parametrize("W", [5, 7, 10])
@pytest.mark.parametrize("H", [5, 7, 10])
def test_local_2d_gaussian_distribution(H: int, W: int, sigma: float) -> None:
    i, j = _coords(H, W)
    ref = torch.exp(-0.5 * sigma**-2.0 * _pairwise(torch.stack([i, j], 1), 2) ** 2)
    torch.testing.assert_close(AP.local_2d_gausian_distribution(H, W, sigma=sigma), ref)


@pytest.mark.parametrize("window_size", [2, 4])
@pytest.mark.parametrize("W", [8, 16])
@pytest.mark.parametrize("H", [8, 16])
def test_swin_attention_pattern(H: int, W: int, window_size: int) -> None:
    d = AP.swin_attention_pattern(H, W, window_size, shift_size=0)
    h, w = H // window_size, W // window_size
    d = d.reshape(h, window_size, w, window_size, h, window_size, w, window_size)
    for (y, x), (y2, x2) in itertools.product(itertools.product(range(h), range(w)), repeat=2):
        same = d[y, :, x, :, y2, :, x2, :]
        assert torch.all(same) if (y, x) == (y2, x2) else torch.all(~same)
    # A half-window shift is the unshifted pattern of a grid padded by a window, cropped back.
    shifted = AP.swin_attention_pattern(H, W, window_size, shift_size=window_size // 2)
    padded = AP.swin_attention_pattern(H + window_size, W + window_size, window_size, shift_size=0)
    crop = slice(window_size // 2, -(window_size // 2))
    padded = padded.reshape(H + window_size, W + window_size, H + window_size, W + window_size)
    assert torch.equal(padded[crop, crop, crop, crop].reshape(H * W, H * W), shifted)


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("W", [8, 15])
@pytest.mark.parametrize("H", [8, 15])
def test_dilated_2d_pattern(H: int, W: int, k: int) -> None:
    d = AP.dilated_2d_pattern(H, W, k).reshape(H, W, H, W)
    for h, w in itertools.product(range(H), range(W)):
        for ii, jj in itertools.product(range(k), range(k)):
            block = d[h, w][ii::k, jj::k]
            assert torch.all(block) if (ii, jj) == (h % k, w % k) else torch.all(~block)


def test_pattern_to_layout() -> None:
    block, size = 16, 128
    n = size // block
    cases = [
        (torch.ones(size, size, dtype=torch.bool), torch.ones(n, n, dtype=torch.long)),
        (torch.eye(size, dtype=torch.bool), torch.eye(n, dtype=torch.long)),
        (torch.ones(size, size).tril(-1).bool(), torch.ones(n, n).tril().long()),
    ]
    for mask, ref in cases:
        assert torch.equal(AP.pattern_to_layout(mask, block), ref)
    stacked = AP.pattern_to_layout(torch.cat([m for m, _ in cases]), block)
    assert torch.equal(stacked, torch.cat([r for _, r in cases]))
    with pytest.raises(AssertionError):
        AP.pattern_to_layout(torch.ones(size + 3, size, dtype=torch.bool), block)


def test_alibi_pattern() -> None:
    mask = AP.alibi_pattern(1e-3, (16, 128, 128))
    assert mask.shape == (16, 1, 128) and torch.sum(mask[:, 0, 0]) == 16


def test_layout_to_pattern() -> None:
    layout = torch.tensor([[[0.0, 1], [1, 0]], [[1, 0], [0, 1]]])
    ref = layout.repeat_interleave(2, dim=1).repeat_interleave(2, dim=2)
    torch.testing.assert_close(AP.layout_to_pattern(layout=layout, block_size=2), ref)


_LONGFORMER = [
    [1, 1, 1, 1, 1, 1, 1, 1],
    [1, 1, 1, 0, 0, 0, 0, 0],
    [1, 1, 1, 1, 0, 0, 0, 0],
    [1, 0, 1, 1, 1, 0, 0, 0],
    [1, 0, 0, 1, 1, 1, 0, 0],
    [1, 0, 0, 0, 1, 1, 1, 0],
    [1, 0, 0, 0, 0, 1, 1, 1],
    [1, 0, 0, 0, 0, 0, 1, 1],
]
_VARIABLE = [[1, 1, 1, 1, 0, 0, 0, 0]] * 4 + [[1, 0, 0, 0, 1, 1, 1, 1]] * 4
_FIXED = [[1, 1, 1, 1, 0, 0, 0, 1]] * 4 + [[0, 0, 0, 1, 1, 1, 1, 1]] * 4


def test_quick_layouts() -> None:
    assert torch.equal(AP.quick_fixed_layout(2, 16, 128), torch.tensor([_FIXED] * 2))
    assert torch.equal(AP.quick_bslongformer_layout(2, 16, 128), torch.tensor([_LONGFORMER] * 2))
    assert torch.equal(AP.quick_variable_layout(2, 16, 128), torch.tensor([_VARIABLE] * 2))
    assert AP.quick_bigbird_layout(2, 16, 128).shape == (2, 8, 8)


def test_dense_sparsity_config() -> None:
    sc = DenseSparsityConfig(num_heads=1, block_size=16)
    with pytest.raises(ValueError):
        sc.setup_layout(seq_len=17)
    assert torch.equal(sc.make_layout(seq_len=32), torch.ones(1, 2, 2, dtype=torch.long))


def test_big_bird_sparsity_config() -> None:
    for random, window, globals_ in ((2, 1, 1), (1, 2, 1), (1, 1, 2)):
        sc = BigBirdSparsityConfig(
            num_heads=1,
            block_size=16,
            num_random_blocks=random,
            num_sliding_window_blocks=window,
            num_global_blocks=globals_,
        )
        with pytest.raises(ValueError):
            sc.make_layout(seq_len=16)
    with pytest.raises(NotImplementedError):
        BigBirdSparsityConfig(num_heads=1, attention="directional")


def test_bslongformer_sparsity_config() -> None:
    sc = BSLongformerSparsityConfig(num_heads=1, global_block_end_indices=[1])
    assert torch.equal(sc.make_layout(128), torch.tensor([_LONGFORMER]))
    for ends in ([], [-1]):
        with pytest.raises(ValueError):
            BSLongformerSparsityConfig(num_heads=1, global_block_end_indices=ends)


def test_fixed_sparsity_config() -> None:
    sc = FixedSparsityConfig(num_heads=1, horizontal_global_attention=True)
    ref = [[1, 1, 1, 1, 0, 0, 1]] * 3 + [[1] * 7] + [[0, 0, 0, 1, 1, 1, 1]] * 2 + [[1] * 7]
    assert torch.equal(sc.make_layout(112), torch.tensor([ref]))
    with pytest.raises(ValueError):
        FixedSparsityConfig(num_heads=1, num_local_blocks=3, num_global_blocks=2)
    with pytest.raises(NotImplementedError):
        FixedSparsityConfig(num_heads=1, attention="directional")
    bad = [
        {"attention": "unidirectional", "horizontal_global_attention": True},
        {"num_different_global_patterns": 2, "different_layout_per_head": False},
        {"num_different_global_patterns": 10, "num_local_blocks": 4, "num_global_blocks": 1},
    ]
    for options in bad:
        with pytest.raises(ValueError):
            FixedSparsityConfig(num_heads=1, **options)


def test_variable_sparsity_config() -> None:
    sc = VariableSparsityConfig(num_heads=1, global_block_end_indices=[1])
    assert torch.equal(sc.make_layout(128), torch.tensor([_VARIABLE]))
    for ends in ([], [-1]):
        with pytest.raises(ValueError):
            VariableSparsityConfig(num_heads=1, global_block_end_indices=ends)
