"""ScaledDotProduct (both backends) against a float64 softmax(QKᵀ/√d)V written in the test."""

import pytest
import torch
from attention_reference import reference_attention

from brickwork.components.attention import ScaledDotProduct
from brickwork.errors import ConfigError

BACKENDS = ["sdpa", "math"]


def _qkv(b=2, h=4, hkv=4, tq=5, tk=5, d=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, tq, d, generator=gen, requires_grad=True)
    k = torch.randn(b, hkv, tk, d, generator=gen, requires_grad=True)
    v = torch.randn(b, hkv, tk, d, generator=gen, requires_grad=True)
    return q, k, v


def _padding(b, tk):
    keep = torch.ones(b, 1, 1, tk, dtype=torch.bool)
    keep[0, ..., -2:] = False
    keep[-1, ..., 1] = False
    return keep


CASES = {
    # name: (shape kwargs, mask builder, causal, scale)
    "plain": ({}, None, False, None),
    "causal": ({}, None, True, None),
    "causal_decode": ({"tq": 3, "tk": 7}, None, True, None),
    "causal_single_step": ({"tq": 1, "tk": 6}, None, True, None),
    "causal_more_queries": ({"tq": 6, "tk": 4}, None, True, None),
    "padding": ({}, lambda s: _padding(s[0], s[3]), False, None),
    "padding_causal_decode": ({"tq": 2, "tk": 6}, lambda s: _padding(s[0], s[3]), True, None),
    "bool_full": ({}, lambda s: torch.rand(s, generator=torch.Generator().manual_seed(1)) > 0.3, False, None),
    "additive": ({}, lambda s: torch.randn(1, s[1], s[2], s[3]), False, None),
    "additive_causal_decode": ({"tq": 3, "tk": 5}, lambda s: torch.randn(s[2], s[3]), True, None),
    "gqa": ({"hkv": 2}, None, True, None),
    "mqa_padding": ({"hkv": 1}, lambda s: _padding(s[0], s[3]), False, None),
    "scale": ({}, None, False, 0.3),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_float64_reference(backend: str, case: str) -> None:
    shape_kwargs, make_mask, causal, scale = CASES[case]
    q, k, v = _qkv(**shape_kwargs)
    full = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    mask = make_mask(full) if make_mask else None
    attention = ScaledDotProduct(causal=causal, backend=backend, scale=scale)
    out = attention(q, k, v, mask)
    expected = reference_attention(q, k, v, mask, causal=causal, scale=scale)
    torch.testing.assert_close(out, expected.float(), atol=1e-5, rtol=1e-5)

    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(expected, (q, k, v), grad.double())
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w.float(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_fully_masked_rows_are_zero_with_finite_grads(backend: str, kind: str) -> None:
    q, k, v = _qkv(tq=4, tk=6)
    keep = torch.ones(2, 4, 4, 6, dtype=torch.bool)
    keep[0, :, 1] = False  # query 1 of batch 0 sees nothing, in every head
    keep[1, 2, 3] = False
    mask = keep if kind == "bool" else torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    out = ScaledDotProduct(backend=backend)(q, k, v, mask)
    assert torch.equal(out[0, :, 1], torch.zeros_like(out[0, :, 1]))
    assert torch.equal(out[1, 2, 3], torch.zeros_like(out[1, 2, 3]))
    torch.testing.assert_close(out, reference_attention(q, k, v, mask).float(), atol=1e-5, rtol=1e-5)
    out.square().sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.equal(q.grad[0, :, 1], torch.zeros_like(q.grad[0, :, 1]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_only_in_training(backend: str) -> None:
    q, k, v = _qkv()
    attention = ScaledDotProduct(dropout=0.5, backend=backend)
    torch.manual_seed(0)
    trained = attention(q, k, v)
    assert not torch.allclose(trained, reference_attention(q, k, v).float(), atol=1e-3)
    attention.eval()
    torch.testing.assert_close(attention(q, k, v), reference_attention(q, k, v).float(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "options,key",
    [
        ({"backend": "flash"}, "backend"),
        ({"dropout": 1.0}, "dropout"),
        ({"dropout": -0.1}, "dropout"),
        ({"causal": "yes"}, "causal"),
        ({"scale": 0.0}, "scale"),
    ],
)
def test_bad_options_name_the_option(options: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        ScaledDotProduct(**options)


def test_unknown_backend_lists_choices() -> None:
    with pytest.raises(ConfigError, match="allowed: math, sdpa"):
        ScaledDotProduct(backend="sdp")


def test_from_config_round_trip() -> None:
    cfg = ScaledDotProduct.Config(dropout=0.1, causal=True, backend="math", scale=0.5)
    built = ScaledDotProduct.from_config(cfg)
    assert built.config == cfg and built.causal
    with pytest.raises(TypeError, match="Config"):
        ScaledDotProduct.from_config({"causal": True})


def test_bad_shapes_raise_value_error() -> None:
    q, k, v = _qkv()
    attention = ScaledDotProduct()
    with pytest.raises(ValueError, match=r"q must be \[B, H, T, D\]"):
        attention(q[0], k, v)
    with pytest.raises(ValueError, match="disagree"):
        attention(q, k[..., :4], v)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        attention(q, k[:, :3], v[:, :3])
    with pytest.raises(ValueError, match="does not broadcast"):
        attention(q, k, v, torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="boolean or float"):
        attention(q, k, v, torch.ones(5, 5, dtype=torch.long))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tq", "tk", "hkv"), [(3, 7, 4), (64, 256, 2), (1, 9, 4)])
def test_causal_with_fewer_queries_than_keys_on_cuda(dtype: torch.dtype, tq: int, tk: int, hkv: int) -> None:
    # On CUDA this takes SDPA's bottom-right CausalBias path instead of a materialised mask.
    q, k, v = (t.detach().cuda().to(dtype).requires_grad_() for t in _qkv(hkv=hkv, tq=tq, tk=tk, d=64))
    out = ScaledDotProduct(causal=True)(q, k, v)
    expected = reference_attention(q.double(), k.double(), v.double(), causal=True)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(expected, (q, k, v), grad.double())
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w.to(torch.float64), atol=10 * tol, rtol=10 * tol)
