"""xformers' mask types and helpers (ported from its test_attention_mask, test_attention_utils and
test_core_attention), on CPU."""

from __future__ import annotations

import pytest
import torch

from brickwork.xformers.components.attention import AttentionMask, SparseCS
from brickwork.xformers.components.attention.core import scaled_dot_product_attention
from brickwork.xformers.components.attention.utils import maybe_merge_masks, reshape_key_padding_mask


def test_mask_creation() -> None:
    bool_mask = torch.rand((256, 256)) > 0.5
    assert (AttentionMask.from_bool(bool_mask).to_bool() == bool_mask).all()
    bool_mask = torch.rand((2, 256, 256)) > 0.5
    additive = AttentionMask.from_bool(bool_mask)
    assert (additive.to_bool() == bool_mask).all()
    assert additive.ndim == bool_mask.ndim
    ref = torch.randint(0, 2, (256, 256))
    assert (AttentionMask.from_multiplicative(ref.float()).to_bool() == ref.bool()).all()
    for args, shape in (((256, 256), (256, 256)), ((256,), (256, 256)), ((256, 128), (256, 128))):
        causal = AttentionMask.make_causal(*args)
        assert (causal.to_bool() == torch.tril(torch.ones(shape)).bool()).all()
        assert causal.is_causal
    m1, m2 = torch.rand((256, 256)) > 0.5, torch.rand((256, 256)) > 0.5
    assert ((AttentionMask.from_bool(m1) + AttentionMask.from_bool(m2)).to_bool() == (m1 & m2)).all()
    moved = AttentionMask.make_causal(256, 256).to(device=torch.device("cpu"), dtype=torch.float64)
    assert moved.is_causal and moved.dtype == torch.float64 and "cpu" in str(moved.values.device)


def test_mask_refuses_bad_input() -> None:
    with pytest.raises(AssertionError):
        AttentionMask(torch.zeros(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError):
        AttentionMask.from_bool(torch.zeros(4, 4))


def test_reshape_key_padding_mask() -> None:
    batch, heads, seq = 2, 2, 4
    padding = torch.randint(0, 2, (batch, seq)).bool()
    reshaped = reshape_key_padding_mask(key_padding_mask=padding, batched_dim=batch * heads)
    assert reshaped.size() == (batch * heads, 1, seq)
    merged = maybe_merge_masks(None, padding, batch_size=batch, src_len=seq, num_heads=heads)
    assert torch.equal(merged, reshaped.expand(-1, seq, -1))
    # Sample b, head h is row b * heads + h.
    assert torch.equal(reshaped[3, 0], padding[1])
    padding = torch.randint(0, 2, (batch * heads, seq)).bool()
    assert reshape_key_padding_mask(padding, batch * heads).size() == (batch * heads, 1, seq)


def _reference(q: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(q qᵀ/√d + mask) q in float64."""
    q = q.double()
    scores = q @ q.transpose(-2, -1) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = (
            scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.double()
        )
    return torch.softmax(scores, dim=-1) @ q


def test_core_attention() -> None:
    b, s, d = 2, 400, 8
    a = torch.rand(b, s, d)
    m = (torch.rand(b, s, s) > 0.95).to_sparse()
    r_sparse = scaled_dot_product_attention(a, a, a, m)
    r_dense = scaled_dot_product_attention(a, a, a, m.to_dense())
    assert torch.allclose(r_sparse, r_dense)
    torch.testing.assert_close(r_dense, _reference(a, m.to_dense()).float(), atol=1e-5, rtol=1e-5)


def test_core_attention_mask_types() -> None:
    b, s, d = 4, 90, 16
    a = torch.rand(b, s, d)
    mask = torch.rand(b, s, s) > 0.8
    assert torch.allclose(
        scaled_dot_product_attention(a, a, a, mask), scaled_dot_product_attention(a, a, a, mask.to_sparse())
    )
    additive = torch.zeros_like(mask, dtype=torch.float).masked_fill(mask, float("-inf"))
    r_add = scaled_dot_product_attention(a, a, a, additive)
    assert torch.allclose(r_add, scaled_dot_product_attention(a, a, a, additive.to_sparse()))
    torch.testing.assert_close(r_add, _reference(a, additive).float(), atol=1e-5, rtol=1e-5)
    # A mask for half the batch is repeated over it.
    half = additive[: b // 2]
    torch.testing.assert_close(
        scaled_dot_product_attention(a, a, a, half),
        _reference(a, half.repeat(2, 1, 1)).float(),
        atol=1e-5,
        rtol=1e-5,
    )


@pytest.mark.parametrize("kind", ["none", "dense", "sparse", "sparsecs"])
def test_amp_attention_keeps_fp32_on_cpu(kind: str) -> None:
    b, s, d = 8, 64, 32
    a = torch.rand(b, s, d)
    m = torch.rand(s, s) > 0.9
    mask = {"none": None, "dense": m, "sparse": m.to_sparse(), "sparsecs": SparseCS(m, "cpu")}[kind]
    assert scaled_dot_product_attention(a, a, a, att_mask=mask).dtype == torch.float32
    if kind == "sparsecs":
        torch.testing.assert_close(
            scaled_dot_product_attention(a, a, a, mask), scaled_dot_product_attention(a, a, a, m)
        )
