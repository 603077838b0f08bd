"""bias-GELU: the Triton kernel (interpreted on CPU, compiled on CUDA) against its float64 twin."""

import math

import pytest
import torch
from kernel_testing import DEVICES, check_against_twin, check_compiles_whole

from brickwork.errors import ConfigError
from brickwork.kernels import bias_gelu, bias_gelu_ref
from brickwork.kernels.fused.bias_gelu import bias_gelu_triton


def _x(shape, device, dtype=torch.float32):
    # Spread wide enough to reach GELU's flat negative tail and its linear positive side.
    return (torch.randn(shape, device=device) * 3).to(dtype).requires_grad_()


def _bias(n, device, dtype=torch.float32):
    return torch.randn(n, device=device).to(dtype).requires_grad_()


def _triton(approximate, max_tile=None):
    if max_tile is None:
        return lambda x, b: bias_gelu(x, b, approximate, backend="triton")
    return lambda x, b: bias_gelu_triton(x, b, approximate, max_tile=max_tile)


def _twin(approximate):
    return lambda x, b: bias_gelu_ref(x, b, approximate)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("n", [1, 7, 127, 1000])
def test_widths(device, approximate, n):
    args = [_x((5, n), device), _bias(n, device)]
    check_against_twin(_triton(approximate), _twin(approximate), args, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize(("rows", "n", "max_tile"), [(9, 7, 16), (11, 1000, 256), (40, 7, 16)])
def test_small_tiles_spread_rows_and_columns_over_programs(device, approximate, rows, n, max_tile):
    args = [_x((rows, n), device), _bias(n, device)]
    check_against_twin(_triton(approximate, max_tile), _twin(approximate), args, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_half_precision(device, dtype, approximate):
    args = [_x((4, 300), device, dtype), _bias(300, device, dtype)]
    check_against_twin(_triton(approximate), _twin(approximate), args, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_leading_dims_non_contiguous_and_no_bias(device):
    x = _x((2, 3, 40, 5), device).transpose(-1, -2)
    assert not x.is_contiguous()
    check_against_twin(_triton("none", 64), _twin("none"), [x, _bias(40, device)], torch.float32)
    check_against_twin(_triton("tanh"), _twin("tanh"), [x, None], torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_bias_gradient_is_bitwise_reproducible(device):
    x, b = _x((33, 20), device), _bias(20, device)
    dy = torch.randn(33, 20, device=device)
    first = torch.autograd.grad(_triton("none", 64)(x, b), (x, b), dy)
    second = torch.autograd.grad(_triton("none", 64)(x, b), (x, b), dy)
    assert all(torch.equal(a, c) for a, c in zip(first, second, strict=True))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_large_on_gpu(dtype, approximate):
    args = [_x((1024, 8192), "cuda", dtype), _bias(8192, "cuda", dtype)]
    check_against_twin(_triton(approximate), _twin(approximate), args, dtype)


@pytest.mark.gpu
def test_compiles_without_graph_breaks_on_gpu():
    x, b = _x((64, 512), "cuda", torch.bfloat16), _bias(512, "cuda", torch.bfloat16)
    check_compiles_whole(lambda x, b: bias_gelu(x, b, "tanh"), _twin("tanh"), [x, b], torch.bfloat16)


def test_twin_matches_the_formulas_in_float64():
    x, b = torch.randn(4, 9, dtype=torch.float64) * 3, torch.randn(9, dtype=torch.float64)
    z = x + b
    exact = 0.5 * z * (1 + torch.erf(z / math.sqrt(2)))
    tanh = 0.5 * z * (1 + torch.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
    torch.testing.assert_close(bias_gelu_ref(x, b, "none"), exact, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(bias_gelu_ref(x, b, "tanh"), tanh, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_twin_gradcheck(approximate):
    x = (torch.randn(3, 5, dtype=torch.float64) * 3).requires_grad_()
    b = torch.randn(5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, b: bias_gelu_ref(x, b, approximate), (x, b))


def test_bad_inputs_raise_clear_errors():
    x = torch.randn(2, 8)
    with pytest.raises(ConfigError, match=r"approximate.*allowed: none, tanh.*did you mean 'tanh'"):
        bias_gelu(x, None, "tahn")
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\).*\(2, 8\)"):
        bias_gelu(x, torch.zeros(2, 8))
    with pytest.raises(TypeError, match=r"x has dtype torch.int64"):
        bias_gelu(torch.ones(2, 8, dtype=torch.long), None)
    with pytest.raises(ValueError, match=r"max_tile must be a power of two"):
        bias_gelu_triton(x, None, max_tile=12)
