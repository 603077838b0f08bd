"""bias-GELU + dropout: the Philox mask is reproducible, seed-dependent, fair, and identical in the twin."""

import math

import pytest
import torch
from kernel_testing import DEVICES, check_against_twin

from brickwork.errors import ConfigError
from brickwork.kernels import bias_gelu, bias_gelu_dropout, bias_gelu_dropout_ref
from brickwork.kernels.fused.bias_gelu import bias_gelu_triton
from brickwork.kernels.philox import dropout_keep_mask


def _positive_x(shape, device):
    # gelu(z) > 0 for z > 0, so an output of exactly zero marks a dropped element.
    return (torch.rand(shape, device=device) + 0.5).requires_grad_()


def _bias(n, device):
    return (torch.rand(n, device=device) * 0.1).requires_grad_()


def _dropout(p, seed, max_tile=None, approximate="none"):
    if max_tile is None:
        return lambda x, b: bias_gelu_dropout(x, b, p, seed, approximate, backend="triton")
    return lambda x, b: bias_gelu_triton(x, b, approximate, p, seed, max_tile=max_tile)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize(("shape", "max_tile"), [((5, 7), None), ((3, 1000), None), ((2, 3, 100), 64)])
def test_matches_twin_forward_and_backward(device, approximate, shape, max_tile):
    x, b = (torch.randn(shape, device=device) * 3).requires_grad_(), _bias(shape[-1], device)
    twin = lambda x, b: bias_gelu_dropout_ref(x, b, 0.3, 99, approximate)
    check_against_twin(_dropout(0.3, 99, max_tile, approximate), twin, [x, b], torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_mask_is_the_twins_mask_bit_for_bit_and_ignores_tiling(device):
    x, b = _positive_x((6, 300), device), _bias(300, device)
    y = _dropout(0.4, 2024)(x, b)
    assert torch.equal(y != 0, dropout_keep_mask(2024, 0.4, x.numel(), device).view(6, 300))
    assert torch.equal(y, _dropout(0.4, 2024, max_tile=32)(x, b))


@pytest.mark.parametrize("device", DEVICES)
def test_same_seed_same_mask_other_seed_other_mask(device):
    x, b = _positive_x((4, 256), device), _bias(256, device)
    first, again = _dropout(0.5, 7)(x, b), _dropout(0.5, 7)(x, b)
    assert torch.equal(first, again)
    other = _dropout(0.5, 8)(x, b)
    # Two independent masks at p = 0.5 agree on about half of 1024 elements, not all of them.
    agreement = ((first != 0) == (other != 0)).float().mean().item()
    assert 0.4 < agreement < 0.6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_within_statistical_bounds(device, p):
    x, b = _positive_x((64, 1000), device), _bias(1000, device)
    n = x.numel()
    kept = (_dropout(p, 31337)(x, b) != 0).float().mean().item()
    # Five standard deviations of a binomial proportion: a false failure is a 1-in-a-million event.
    assert abs(kept - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("device", DEVICES)
def test_kept_values_are_scaled_and_dropped_gradients_are_zero(device):
    x, b = _positive_x((4, 128), device), _bias(128, device)
    y = _dropout(0.25, 5)(x, b)
    plain = bias_gelu(x, b, backend="triton")
    keep = y != 0
    torch.testing.assert_close(y[keep], plain[keep] / 0.75)
    (dx,) = torch.autograd.grad(y.sum(), (x,))
    assert torch.equal(dx == 0, ~keep)


@pytest.mark.parametrize("device", DEVICES)
def test_half_precision(device):
    x = (torch.randn(4, 300, device=device) * 3).to(torch.bfloat16).requires_grad_()
    b = torch.randn(300, device=device).to(torch.bfloat16).requires_grad_()
    twin = lambda x, b: bias_gelu_dropout_ref(x, b, 0.2, 3)
    check_against_twin(_dropout(0.2, 3), twin, [x, b], torch.bfloat16)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_eval_mode_and_p_zero_are_plain_bias_gelu(backend):
    x, b = torch.randn(3, 20), torch.randn(20)
    plain = bias_gelu(x, b, backend=backend)
    assert torch.equal(bias_gelu_dropout(x, b, 0.5, 1, training=False, backend=backend), plain)
    assert torch.equal(bias_gelu_dropout(x, b, 0.0, 1, backend=backend), plain)


def test_cpu_default_runs_the_twin_with_the_same_mask():
    x, b = _positive_x((5, 40), "cpu"), _bias(40, "cpu")
    y = bias_gelu_dropout(x, b, 0.3, 11)
    assert torch.equal(y, bias_gelu_dropout_ref(x, b, 0.3, 11))
    assert torch.equal(y != 0, _dropout(0.3, 11)(x, b) != 0)


@pytest.mark.gpu
def test_gpu_mask_equals_the_twins_mask():
    x, b = _positive_x((512, 4096), "cuda"), _bias(4096, "cuda")
    y = bias_gelu_dropout(x, b, 0.1, 2**40 + 1)
    assert torch.equal(y != 0, dropout_keep_mask(2**40 + 1, 0.1, x.numel(), "cuda").view_as(x))
    torch.testing.assert_close(y, bias_gelu_dropout_ref(x, b, 0.1, 2**40 + 1))


def test_bad_dropout_options_raise_config_errors():
    x = torch.randn(2, 4)
    with pytest.raises(ConfigError, match=r"p: dropout probability p must be in \[0, 1\), got 1.0"):
        bias_gelu_dropout(x, None, 1.0, 0)
    with pytest.raises(ConfigError, match=r"p: .*got -0.1"):
        bias_gelu_dropout(x, None, -0.1, 0)
    with pytest.raises(ConfigError, match=r"seed: seed must be an int in \[0, 2\*\*63\), got -1"):
        bias_gelu_dropout(x, None, 0.1, -1)
    with pytest.raises(ConfigError, match=r"seed: .*got 1.5"):
        bias_gelu_dropout(x, None, 0.1, 1.5)
