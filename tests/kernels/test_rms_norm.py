"""RMSNorm: the Triton kernel (interpreted on CPU, compiled on CUDA) against its float64 twin."""

import pytest
import torch
from kernel_testing import DEVICES, check_against_twin, check_compiles_whole

from brickwork.errors import ConfigError
from brickwork.kernels import rms_norm, rms_norm_ref
from brickwork.kernels.fused.rms_norm import rms_norm_triton


def _x(shape, device, dtype=torch.float32):
    return (torch.randn(shape, device=device) * 2 + 0.5).to(dtype).requires_grad_()


def _w(n, device, dtype=torch.float32):
    return (torch.randn(n, device=device) * 0.5 + 1).to(dtype).requires_grad_()


def _triton(max_block=None):
    if max_block is None:
        return lambda x, w: rms_norm(x, w, 1e-6, backend="triton")
    return lambda x, w: rms_norm_triton(x, w, 1e-6, max_block=max_block)


def _twin(x, w):
    return rms_norm_ref(x, w, 1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("n", "max_block"), [(1, None), (7, None), (127, None), (1000, None), (1000, 256)])
def test_widths(device, n, max_block):
    check_against_twin(_triton(max_block), _twin, [_x((5, n), device), _w(n, device)], torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("max_block", [None, 128])
def test_half_precision(device, dtype, max_block):
    check_against_twin(
        _triton(max_block), _twin, [_x((4, 300), device, dtype), _w(300, device, dtype)], dtype
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("max_block", [None, 16])
def test_leading_dims_non_contiguous_and_no_weight(device, max_block):
    x = _x((2, 3, 4, 66), device)[..., ::2]
    assert not x.is_contiguous()
    check_against_twin(_triton(max_block), _twin, [x, _w(33, device)], torch.float32)
    check_against_twin(_triton(max_block), _twin, [x, None], torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("max_block", [None, 16])
def test_weight_gradient_is_bitwise_reproducible(device, max_block):
    x, w = _x((13, 50), device), _w(50, device)
    dy = torch.randn(13, 50, device=device)
    first = torch.autograd.grad(_triton(max_block)(x, w), (x, w), dy)
    second = torch.autograd.grad(_triton(max_block)(x, w), (x, w), dy)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [4096, 16384, 65536])
def test_large_rows_on_gpu(dtype, n):
    check_against_twin(_triton(), _twin, [_x((64, n), "cuda", dtype), _w(n, "cuda", dtype)], dtype)


@pytest.mark.gpu
def test_compiles_without_graph_breaks_on_gpu():
    x, w = _x((8, 512), "cuda", torch.bfloat16), _w(512, "cuda", torch.bfloat16)
    check_compiles_whole(rms_norm, _twin, [x, w], torch.bfloat16)


def test_twin_matches_the_formula_in_float64():
    x, w = torch.randn(3, 4, 19, dtype=torch.float64), torch.randn(19, dtype=torch.float64)
    expected = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(rms_norm_ref(x, w, 1e-6), expected, rtol=1e-12, atol=1e-12)


def test_twin_gradcheck():
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: rms_norm_ref(x, w, 1e-6), (x, w))


def test_bad_inputs_raise_clear_errors():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        rms_norm(x, torch.ones(9))
    with pytest.raises(TypeError, match=r"weight has dtype torch.int32"):
        rms_norm(x, torch.ones(8, dtype=torch.int32))
    with pytest.raises(ConfigError, match=r"eps"):
        rms_norm(x, None, eps=float("nan"))
    with pytest.raises(ConfigError, match=r"backend"):
        rms_norm(x, None, backend="Triton")


@pytest.mark.parametrize("device", DEVICES)
def test_width_one_matches_the_float64_twin_closely(device):
    # dx = w dy rstd (1 - xhat**2) cancels almost completely in one column; the kernel must not lose it.
    x = (torch.randn(9, 1, device=device) * 2 + 0.5).requires_grad_()
    w = torch.randn(1, device=device).requires_grad_()
    dy = torch.randn(9, 1, device=device)
    grads = torch.autograd.grad(rms_norm(x, w, backend="triton"), (x, w), dy)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = torch.autograd.grad(rms_norm_ref(x64, w64, 1e-6), (x64, w64), dy.double())
    for grad, expected in zip(grads, ref, strict=True):
        torch.testing.assert_close(grad.double(), expected, rtol=1e-5, atol=0.0)


@pytest.mark.parametrize("device", DEVICES)
def test_many_rows_per_program(device):
    # 67 rows over four programs: 17 rows each, the last program 16, all adding into one partial row.
    x, w = _x((67, 300), device), _w(300, device)
    check_against_twin(_triton(), _twin, [x, w], torch.float32)
