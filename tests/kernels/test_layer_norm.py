"""LayerNorm: the Triton kernel (interpreted on CPU, compiled on CUDA) against its float64 twin."""

import pytest
import torch
import torch.nn.functional as F
from kernel_testing import DEVICES, check_against_twin, check_compiles_whole

from brickwork.errors import ConfigError
from brickwork.kernels import layer_norm, layer_norm_ref
from brickwork.kernels.fused.layer_norm import layer_norm_triton


def _params(n, device, dtype=torch.float32, weight=True, bias=True):
    w = (torch.randn(n, device=device) * 0.5 + 1).to(dtype).requires_grad_() if weight else None
    b = torch.randn(n, device=device).to(dtype).requires_grad_() if bias else None
    return w, b


def _x(shape, device, dtype=torch.float32):
    # An offset mean and a spread > 1, so that centring and scaling both matter.
    return (torch.randn(shape, device=device) * 2 + 0.5).to(dtype).requires_grad_()


def _triton(max_block=None):
    if max_block is None:
        return lambda x, w, b: layer_norm(x, w, b, 1e-5, backend="triton")
    return lambda x, w, b: layer_norm_triton(x, w, b, 1e-5, max_block=max_block)


def _twin(x, w, b):
    return layer_norm_ref(x, w, b, 1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [1, 7, 127, 1000])
def test_one_block_widths(device, n):
    check_against_twin(_triton(), _twin, [_x((5, n), device), *_params(n, device)], torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("n", "max_block"), [(1000, 256), (33, 8), (64, 16)])
def test_rows_wider_than_a_block_take_the_looped_path(device, n, max_block):
    check_against_twin(_triton(max_block), _twin, [_x((5, n), device), *_params(n, device)], torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("max_block", [None, 128])
def test_half_precision(device, dtype, max_block):
    n = 300
    args = [_x((4, n), device, dtype), *_params(n, device, dtype)]
    check_against_twin(_triton(max_block), _twin, args, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_half_input_with_float32_parameters(device):
    args = [_x((4, 50), device, torch.bfloat16), *_params(50, device)]
    check_against_twin(_triton(), _twin, args, torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
def test_several_leading_dims(device):
    args = [_x((2, 3, 4, 33), device), *_params(33, device)]
    assert check_against_twin(_triton(), _twin, args, torch.float32).shape == (2, 3, 4, 33)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["strided_columns", "permuted", "transposed"])
def test_non_contiguous_views(device, layout):
    if layout == "strided_columns":
        x = _x((6, 66), device)[:, ::2]  # column stride 2
    elif layout == "permuted":
        x = _x((33, 4, 5), device).permute(1, 2, 0)  # rows collapse to stride 1, columns stride 20
    else:
        x = _x((4, 3, 33), device).transpose(0, 1)  # leading dims do not collapse
    assert not x.is_contiguous()
    check_against_twin(_triton(max_block=16), _twin, [x, *_params(x.shape[-1], device)], torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("weight", "bias"), [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("max_block", [None, 16])
def test_optional_weight_and_bias(device, weight, bias, max_block):
    args = [_x((5, 40), device), *_params(40, device, weight=weight, bias=bias)]
    check_against_twin(_triton(max_block), _twin, args, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("max_block", [None, 16])
def test_parameter_gradients_are_bitwise_reproducible(device, max_block):
    # 13 rows over four programs, each writing its own partial sums; torch adds them in a fixed order.
    x, (w, b) = _x((13, 50), device), _params(50, device)
    dy = torch.randn(13, 50, device=device)

    def grads():
        return torch.autograd.grad(_triton(max_block)(x, w, b), (x, w, b), dy)

    first, second = grads(), grads()
    for a, c in zip(first, second, strict=True):
        assert torch.equal(a, c)


@pytest.mark.parametrize("device", DEVICES)
def test_no_rows(device):
    x, (w, b) = _x((0, 8), device), _params(8, device)
    y = layer_norm(x, w, b, backend="triton")
    assert y.shape == (0, 8)
    dw, db = torch.autograd.grad(y.sum(), (w, b))
    assert torch.equal(dw, torch.zeros_like(dw)) and torch.equal(db, torch.zeros_like(db))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [4096, 16384, 65536])
def test_large_rows_on_gpu(dtype, n):
    args = [_x((64, n), "cuda", dtype), *_params(n, "cuda", dtype)]
    check_against_twin(_triton(), _twin, args, dtype)


@pytest.mark.gpu
def test_compiles_without_graph_breaks_on_gpu():
    x, (w, b) = _x((8, 512), "cuda", torch.bfloat16), _params(512, "cuda", torch.bfloat16)
    check_compiles_whole(layer_norm, _twin, [x, w, b], torch.bfloat16)


def test_twin_matches_the_formula_in_float64():
    x = torch.randn(3, 4, 19, dtype=torch.float64)
    w, b = torch.randn(19, dtype=torch.float64), torch.randn(19, dtype=torch.float64)
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    expected = (x - mean) / torch.sqrt(var + 1e-5) * w + b
    torch.testing.assert_close(layer_norm_ref(x, w, b, 1e-5), expected, rtol=1e-12, atol=1e-12)


def test_twin_gradcheck():
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: layer_norm_ref(x, w, b, 1e-5), (x, w, b))


def test_twin_rounds_half_inputs_once():
    x = torch.randn(4, 64).to(torch.bfloat16)
    expected = F.layer_norm(x.float(), (64,)).to(torch.bfloat16)
    assert torch.equal(layer_norm_ref(x, None, None), expected)


def test_cpu_default_is_the_twin():
    x, (w, b) = _x((3, 10), "cpu"), _params(10, "cpu")
    assert torch.equal(layer_norm(x, w, b), layer_norm_ref(x, w, b))


def test_bad_inputs_raise_clear_errors():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\).*\(7,\)"):
        layer_norm(x, torch.ones(7), None)
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        layer_norm(x, None, torch.ones(2, 4))
    with pytest.raises(TypeError, match=r"x has dtype torch.int64"):
        layer_norm(torch.ones(2, 8, dtype=torch.long), None, None)
    with pytest.raises(TypeError, match=r"x has dtype torch.float64; expected torch.float32"):
        layer_norm(x.double(), None, None, backend="triton")
    with pytest.raises(ValueError, match=r"non-empty last dimension"):
        layer_norm(torch.tensor(1.0), None, None)
    with pytest.raises(ConfigError, match=r"eps"):
        layer_norm(x, None, None, eps=-1.0)
    with pytest.raises(ConfigError, match=r"backend.*allowed: torch, triton"):
        layer_norm(x, None, None, backend="cuda")
    with pytest.raises(ValueError, match=r"max_block must be a power of two"):
        layer_norm_triton(x, None, None, max_block=100)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("max_block", [None, 1])
def test_width_one_gives_the_bias_and_zero_input_gradient_exactly(device, max_block):
    # x - mean is exactly 0 in one column, so y = bias, dx = 0 and dweight = 0, with no rounding error.
    x, (w, b) = _x((9, 1), device), _params(1, device)
    y = _triton(max_block)(x, w, b)
    assert torch.equal(y, b.detach().expand(9, 1))
    dx, dw, _ = torch.autograd.grad(y, (x, w, b), torch.randn_like(y))
    assert torch.equal(dx, torch.zeros_like(dx)) and torch.equal(dw, torch.zeros_like(dw))


@pytest.mark.parametrize("device", DEVICES)
def test_many_rows_per_program(device):
    # 67 rows over four programs: 17 rows each, the last program 16, all adding into one partial row.
    check_against_twin(_triton(), _twin, [_x((67, 300), device), *_params(300, device)], torch.float32)
