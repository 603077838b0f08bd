"""xformers' Triton ops (ported from xformers' test_triton_layernorm, test_triton_softmax and
test_triton_dropout): the ``gpu`` cases against torch on CUDA; the CPU cases check the torch twins."""

from __future__ import annotations

import pytest
import torch

from brickwork.xformers.triton import FusedDropoutBias, FusedLayerNorm, dropout, log_softmax, softmax

SHAPES = [(384, 128), (8, 384, 128), (8, 784, 512), (4, 16, 384), (4, 16, 1024), (2, 16, 2048)]


def _softmax_case(device: str, shape: tuple[int, ...], log: bool, masking: bool, causal: bool) -> None:
    torch.random.manual_seed(0)
    x = torch.normal(0, 1, size=shape, device=device)
    x_ref = x.clone().requires_grad_(True)
    x = x.requires_grad_(True)
    seq = shape[-1]
    mask = torch.zeros(seq, seq, device=device)
    if masking:
        mask[torch.rand(seq, seq, device=device) > 0.8] = -float("inf")
    ref_mask = mask.clone()
    if causal:
        ref_mask[~torch.ones_like(mask).tril().bool()] = -float("inf")
    y_ref = torch.log_softmax(x_ref + ref_mask, dim=-1) if log else torch.softmax(x_ref + ref_mask, dim=-1)
    fn = log_softmax if log else softmax
    y = fn(x, mask if masking else None, causal)
    live = torch.isfinite(y_ref).any(-1) if log else ~torch.isnan(y_ref).any(-1)  # rows with a key left
    torch.testing.assert_close(y[live], y_ref[live], atol=1e-5, rtol=1e-4)
    for out in (y, y_ref):
        finite = torch.where(torch.isfinite(out), out, torch.zeros_like(out))
        torch.norm(finite.transpose(-2, -1) @ finite).backward()
    # Through a row with no key left, torch's backward is NaN; the softmax kernel's is zero there
    # (log_softmax runs torch's own).
    torch.testing.assert_close(torch.norm(x.grad[live]), torch.norm(x_ref.grad[live]), atol=1e-5, rtol=1e-4)
    if not log:
        assert torch.equal(x.grad[~live], torch.zeros_like(x.grad[~live]))


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("masking", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_softmax_parity_cpu(log: bool, masking: bool, causal: bool) -> None:
    _softmax_case("cpu", (2, 64, 64), log, masking, causal)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(384, 384), (2, 384, 384), (1, 784, 784), (2, 2, 384, 384)])
@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("masking", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_softmax_parity(shape: tuple[int, ...], log: bool, masking: bool, causal: bool) -> None:
    _softmax_case("cuda", shape, log, masking, causal)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("shape", SHAPES[:3])
def test_layernorm_parity(device: str, shape: tuple[int, ...]) -> None:
    torch.random.manual_seed(0)
    x = torch.normal(0, 1, size=shape, device=device, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    eps = 1e-5
    reference = torch.nn.LayerNorm(shape[-1], eps=eps).to(device)
    fused = FusedLayerNorm(shape[-1], affine=True, eps=eps).to(device)
    with torch.no_grad():
        for p in (reference.weight, fused.weight):
            p.copy_(torch.linspace(0.5, 1.5, shape[-1]))
        for p in (reference.bias, fused.bias):
            p.copy_(torch.linspace(-0.1, 0.1, shape[-1]))
    y, y_ref = fused(x), reference(x_ref)
    torch.testing.assert_close(y, y_ref, atol=1e-4, rtol=1e-4)
    y.sum().backward()
    y_ref.sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(fused.weight.grad, reference.weight.grad, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(fused.bias.grad, reference.bias.grad, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layernorm_no_contiguous(dtype: torch.dtype) -> None:
    x = torch.normal(0, 1, size=(8, 384, 128), dtype=dtype).transpose(2, 1).contiguous().transpose(2, 1)
    assert not x.is_contiguous()
    assert FusedLayerNorm(x.shape[-1]).to(dtype=dtype)(x).shape == x.shape


def test_dropout_cpu() -> None:
    layer = FusedDropoutBias(p=0.1, bias_shape=None)
    x = torch.normal(0, 1, size=(16, 16))
    layer.eval()
    assert layer(x).count_nonzero() == x.numel()
    layer.train()
    assert layer(x).count_nonzero() != x.numel()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("p", [0, 0.1, 0.5])
def test_dropout(device: str, bias: bool, p: float) -> None:
    torch.random.manual_seed(0)
    x = torch.normal(0, 1, size=(8, 384, 128), device=device)
    b = torch.normal(0, 1, size=(128,), device=device) if bias else None
    shifted = x + b if bias else x
    torch.testing.assert_close(dropout(x, p=0, bias=b), shifted)
    assert torch.equal(dropout(x, p=1, bias=b), torch.zeros_like(x))
    assert not torch.allclose(dropout(x, p=0.99, bias=b), shifted)
    y_a, y_b = dropout(x, p=0.5), dropout(x, p=0.5)
    assert not torch.equal(y_a == 0, y_b == 0)
    y = dropout(x, p=p)
    assert abs((y.numel() - y.count_nonzero()).item() / y.numel() - p) < 0.02
    torch.manual_seed(0)
    y_1 = dropout(x, p=0.5)
    torch.manual_seed(0)
    assert torch.equal(y_1, dropout(x, p=0.5))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("activation", ["gelu", "relu", "squared_relu", "leaky_relu", "smelu", "star_relu"])
def test_dropout_activation(device: str, activation: str) -> None:
    """p = 0: exactly activation(x + bias); p > 0: kept values are activation(x + bias) / (1 - p)."""
    from brickwork.xformers.components import build_activation

    torch.random.manual_seed(0)
    x = torch.normal(0, 1, size=(4, 16, 256), device=device)
    b = torch.normal(0, 1, size=(256,), device=device)
    ref = build_activation(activation)(x + b)
    torch.testing.assert_close(dropout(x, p=0.0, bias=b, activation=activation), ref)
    y = dropout(x, p=0.3, bias=b, activation=activation)
    kept = y != 0
    torch.testing.assert_close(y[kept], ref[kept] / 0.7, atol=1e-5, rtol=1e-4)
