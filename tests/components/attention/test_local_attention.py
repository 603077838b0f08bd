"""LocalAttention, masked and FlexAttention paths, against a dense float64 reference with a window mask."""

import warnings

import pytest
import torch
from attention_reference import reference_attention

from brickwork.components.attention import LocalAttention
from brickwork.components.attention.sparse import MAX_CACHED_MASKS
from brickwork.errors import ConfigError

SHAPES = [(6, 6), (3, 9), (1, 7)]  # (Tq, Tk): full sequence, a decode chunk, a single decode step


def _qkv(tq: int, tk: int, hkv: int = 2, d: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, tq, d, generator=gen, requires_grad=True)
    k = torch.randn(2, hkv, tk, d, generator=gen, requires_grad=True)
    v = torch.randn(2, hkv, tk, d, generator=gen, requires_grad=True)
    return q, k, v


@pytest.mark.parametrize("window_size", [1, 3, 4, 7])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tq,tk", SHAPES)
def test_masked_path_matches_dense_reference(window_size: int, causal: bool, tq: int, tk: int) -> None:
    q, k, v = _qkv(tq, tk)
    out = LocalAttention(window_size=window_size, causal=causal, backend="masked")(q, k, v)
    expected = reference_attention(q, k, v, causal=causal, window=window_size // 2)
    torch.testing.assert_close(out, expected.float(), atol=1e-5, rtol=1e-5)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(expected, (q, k, v), grad.double())
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w.float(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_window_combines_with_padding_and_gqa(causal: bool) -> None:
    q, k, v = _qkv(5, 8, hkv=1)
    keep = torch.ones(2, 1, 1, 8, dtype=torch.bool)
    keep[0, ..., 5:7] = False
    out = LocalAttention(window_size=5, causal=causal)(q, k, v, keep)
    expected = reference_attention(q, k, v, keep, causal=causal, window=2)
    torch.testing.assert_close(out, expected.float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tq,tk", [*SHAPES, (5, 3)])
def test_flex_path_matches_dense_reference(causal: bool, tq: int, tk: int) -> None:
    # FlexAttention has no backward on CPU: this checks its block-mask forward.
    q, k, v = (t.detach() for t in _qkv(tq, tk))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention warns that it is unfused
        out = LocalAttention(window_size=3, causal=causal, backend="flex")(q, k, v)
    expected = reference_attention(q, k, v, causal=causal, window=1)
    torch.testing.assert_close(out, expected.float(), atol=1e-5, rtol=1e-5)


def test_flex_refuses_what_it_cannot_do() -> None:
    q, k, v = _qkv(4, 4)
    with pytest.raises(ValueError, match="flex"):
        LocalAttention(backend="flex")(q, k, v, torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="flex"):
        LocalAttention(backend="flex", dropout=0.1).train()(q, k, v)


@pytest.mark.parametrize(
    "options,key",
    [
        ({"window_size": 0}, "window_size"),
        ({"window_size": 2.5}, "window_size"),
        ({"backend": "x"}, "backend"),
    ],
)
def test_bad_options(options: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        LocalAttention(**options)


def test_flex_block_masks_are_cached_with_a_bound() -> None:
    attention = LocalAttention(window_size=3, backend="flex")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for t in range(1, MAX_CACHED_MASKS + 4):
            x = torch.randn(1, 1, t, 4)
            attention(x, x, x)
            attention(x, x, x)
    assert len(attention._masks) == MAX_CACHED_MASKS
