"""Linformer and Nyström attention against formulas written in the test."""

import pytest
import torch
import torch.nn.functional as F
from attention_reference import reference_attention

from brickwork.components.attention import LinformerAttention, NystromAttention
from brickwork.components.attention.nystrom import iterative_pinv, segment_means
from brickwork.errors import ConfigError


def _qkv(t: int = 12, d: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 3, t, d, generator=gen) for _ in range(3))


def test_linformer_matches_projected_softmax() -> None:
    torch.manual_seed(0)
    attention = LinformerAttention(seq_len=12, k=5)
    q, k, v = _qkv()
    e, f = attention.key_projection.detach().double(), attention.value_projection.detach().double()
    expected = reference_attention(q, torch.einsum("ps,bhsd->bhpd", e, k.double()), f @ v.double())
    torch.testing.assert_close(attention(q, k, v), expected.float(), atol=1e-5, rtol=1e-5)
    assert attention.dim_projection == 5 and LinformerAttention(seq_len=12).dim_projection == 3


def test_linformer_short_sequences_equal_zero_padding() -> None:
    attention = LinformerAttention(seq_len=12, k=4)
    q, k, v = _qkv(t=7)
    pad = (0, 0, 0, 5)
    torch.testing.assert_close(attention(q, k, v), attention(q, F.pad(k, pad), F.pad(v, pad)))


def test_linformer_key_padding_equals_zeroed_keys() -> None:
    attention = LinformerAttention(seq_len=12, k=4)
    q, k, v = _qkv()
    keep = torch.ones(2, 1, 1, 12, dtype=torch.bool)
    keep[1, ..., 8:] = False
    zeroed = keep.transpose(-2, -1)
    torch.testing.assert_close(attention(q, k, v, keep), attention(q, k * zeroed, v * zeroed))


def test_linformer_errors() -> None:
    with pytest.raises(ConfigError, match="seq_len"):
        LinformerAttention()
    with pytest.raises(ConfigError, match=r"^k:"):
        LinformerAttention(seq_len=8, k=0)
    q, k, v = _qkv(t=9)
    with pytest.raises(ValueError, match="exceeds seq_len=8"):
        LinformerAttention(seq_len=8)(q, k, v)


def test_segment_means_follow_adaptive_pooling() -> None:
    x = torch.randn(2, 3, 11, 4)
    pooled = F.adaptive_avg_pool1d(x.reshape(6, 11, 4).transpose(1, 2), 4).transpose(1, 2).reshape(2, 3, 4, 4)
    torch.testing.assert_close(segment_means(x, 4), pooled)


@pytest.mark.parametrize("original_init", [False, True])
def test_iterative_pinv_converges_to_pinv(original_init: bool) -> None:
    kernel = torch.softmax(torch.randn(2, 3, 6, 6, dtype=torch.float64), dim=-1)
    torch.testing.assert_close(iterative_pinv(kernel, 40, original_init), torch.linalg.pinv(kernel))


def test_nystrom_is_exact_when_there_are_few_tokens() -> None:
    q, k, v = _qkv(t=6)
    out = NystromAttention(num_landmarks=6)(q, k, v)
    torch.testing.assert_close(out, reference_attention(q, k, v).float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("razavi", [False, True])
def test_nystrom_is_exact_for_segment_constant_inputs(razavi: bool) -> None:
    # When q and k are constant within each landmark segment, softmax(q kᵀ) has rank num_landmarks and
    # the Nyström factorization reproduces it exactly.
    gen = torch.Generator().manual_seed(1)
    q_land, k_land = torch.randn(2, 3, 4, 8, generator=gen), torch.randn(2, 3, 4, 8, generator=gen)
    q, k = q_land.repeat_interleave(3, dim=2), k_land.repeat_interleave(3, dim=2)
    v = torch.randn(2, 3, 12, 8, generator=gen)
    attention = NystromAttention(num_landmarks=4, use_razavi_pinverse=razavi, inv_iterations=30)
    torch.testing.assert_close(attention(q, k, v), reference_attention(q, k, v).float(), atol=1e-4, rtol=1e-4)


def test_nystrom_approximates_softmax_attention() -> None:
    # Smooth inputs (neighbouring tokens alike) are where landmarks summarize well.
    gen = torch.Generator().manual_seed(2)
    walk = torch.randn(3, 1, 1, 64, 8, generator=gen).cumsum(dim=3) * 0.1
    q, k, v = walk[0].expand(1, 2, 64, 8), walk[1].expand(1, 2, 64, 8), walk[2].expand(1, 2, 64, 8)
    exact = reference_attention(q, k, v).float()
    coarse = (NystromAttention(num_landmarks=4)(q, k, v) - exact).abs().mean()
    fine = (NystromAttention(num_landmarks=16)(q, k, v) - exact).abs().mean()
    assert fine < coarse and fine < 0.05 * exact.abs().mean()


@pytest.mark.parametrize("padded", [False, True])
def test_causal_nystrom_approximates_causal_attention_without_looking_ahead(padded: bool) -> None:
    gen = torch.Generator().manual_seed(2)
    walk = torch.randn(3, 1, 1, 64, 8, generator=gen).cumsum(dim=3) * 0.1
    q, k, v = walk[0].expand(2, 2, 64, 8), walk[1].expand(2, 2, 64, 8), walk[2].expand(2, 2, 64, 8)
    keep = torch.ones(2, 1, 1, 64, dtype=torch.bool)
    if padded:
        keep[1, ..., 20:40] = False  # whole landmark segments of padding in the middle
    mask = keep if padded else None
    exact = reference_attention(q, k, v, mask, causal=True).float()
    errors = []
    for m in (4, 16):
        out = NystromAttention(num_landmarks=m, causal=True)(q, k, v, mask)
        errors.append((out - exact).abs().mean())
        # Rows before the first landmark are exact.
        torch.testing.assert_close(out[..., : 64 // m - 1, :], exact[..., : 64 // m - 1, :])
    assert errors[1] < errors[0] < 0.2 * exact.abs().mean()
    assert errors[1] < 0.06 * exact.abs().mean()


def test_nystrom_errors() -> None:
    with pytest.raises(ConfigError, match="num_landmarks"):
        NystromAttention(num_landmarks=0)
    with pytest.raises(ConfigError, match="inv_iterations"):
        NystromAttention(inv_iterations=-1)
