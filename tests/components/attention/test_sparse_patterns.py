"""The sparsity patterns: their keep rules against explicit loops, FlexAttention block masks against
the dense masks, and document masking composed with causality."""

import warnings

import pytest
import torch
from attention_reference import reference_attention

from brickwork.components.attention import (
    BlockSparseAttention,
    GlobalAttention,
    LocalAttention,
    MultiHeadAttention,
    RandomAttention,
)
from brickwork.components.attention.masks import document_mask
from brickwork.errors import ConfigError

T = 37  # not a multiple of FlexAttention's 128-wide blocks nor of the block sizes below


def patterns(causal: bool) -> list:
    return [
        LocalAttention(window_size=7, causal=causal),
        RandomAttention(r=0.2, seed=3, causal=causal),
        GlobalAttention(num_global_tokens=2, causal=causal),
        BlockSparseAttention(block_size=8, causal=causal),
        BlockSparseAttention(
            block_size=8, layout=[[i >= j for j in range(5)] for i in range(5)], causal=causal
        ),
    ]


def explicit(pattern, tq: int, tk: int) -> torch.Tensor:
    keep = torch.zeros(tq, tk, dtype=torch.bool)
    for i in range(tq):
        pos = i + tk - tq
        for j in range(tk):
            if isinstance(pattern, LocalAttention):
                ok = abs(pos - j) <= pattern.window_size // 2
            elif isinstance(pattern, GlobalAttention):
                ok = j < 2 or pos < 2 or j == pos
            elif isinstance(pattern, BlockSparseAttention) and pattern.layout is None:
                ok = pos // 8 - j // 8 in (0, 1) or j < 8
            elif isinstance(pattern, BlockSparseAttention):
                ok = pos // 8 >= j // 8
            else:
                ok = bool(pattern.keep(torch.tensor(pos), torch.tensor(j)))
            keep[i, j] = ok and (j <= pos or not pattern.causal)
    return keep


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("index", range(5))
def test_dense_path_is_softmax_over_the_pattern(causal: bool, index: int) -> None:
    pattern = patterns(causal)[index]
    q, k, v = (torch.randn(2, 3, T, 8) for _ in range(3))
    keep = explicit(pattern, T, T)
    assert torch.equal(pattern.dense_keep(T, T, "cpu"), keep)
    torch.testing.assert_close(
        pattern(q, k, v), reference_attention(q, k, v, keep).float(), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("index", range(5))
def test_flex_block_masks_match_the_dense_masks(causal: bool, index: int) -> None:
    pattern = patterns(causal)[index]
    q, k, v = torch.randn(2, 4, T, 8), torch.randn(2, 2, T, 8), torch.randn(2, 2, T, 8)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention on CPU warns that it is unfused
        pattern.backend = "flex"
        flex = pattern(q, k, v)
        pattern.backend = "masked"
        dense = pattern(q, k, v)
    torch.testing.assert_close(flex, dense, atol=1e-5, rtol=1e-5)


def test_random_pattern_is_fixed_and_keeps_its_fraction() -> None:
    keep = RandomAttention(r=0.25, seed=1).dense_keep(256, 256, "cpu")
    assert torch.equal(keep, RandomAttention(r=0.25, seed=1).dense_keep(256, 256, "cpu"))
    assert keep.diagonal().all() and abs(keep.float().mean().item() - 0.25) < 0.02
    assert not torch.equal(keep, RandomAttention(r=0.25, seed=2).dense_keep(256, 256, "cpu"))


def test_pattern_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="layout"):
        BlockSparseAttention(layout=[[True, False]])
    with pytest.raises(ConfigError, match="seed"):
        RandomAttention(seed=-1)
    with pytest.raises(ValueError, match="exceed the layout"):
        BlockSparseAttention(block_size=2, layout=[[True]])(*(torch.randn(1, 1, 3, 4) for _ in range(3)))


@pytest.mark.parametrize("mechanism", ["scaled_dot_product", "local"])
def test_document_mask_with_causal_equals_each_document_alone(mechanism: str) -> None:
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 2, attention=mechanism, causal=True)
    lengths = [5, 3, 6]
    x = torch.randn(1, sum(lengths), 16)
    ids = torch.repeat_interleave(torch.arange(3), torch.tensor(lengths))[None]
    packed = layer(x, attn_mask=document_mask(ids))
    alone = torch.cat([layer(part) for part in x.split(lengths, dim=1)], dim=1)
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="document ids"):
        document_mask(ids[0])


def test_the_mask_benchmark_runs_and_its_backends_agree() -> None:
    from brickwork.benchmarks.attention_masks import run

    rows = run([64], batch=1, heads=2, dim_head=8)
    assert {row["pattern"].split()[0] for row in rows} == {"local", "random", "global", "blocksparse"}
    assert all(row["max_abs_difference"] < 1e-5 and 0 < row["density"] <= 1 for row in rows)
