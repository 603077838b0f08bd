"""Scaled masked softmax: the Triton kernel (interpreted on CPU, compiled on CUDA) against its twin."""

import pytest
import torch
from kernel_testing import DEVICES, assert_matches, check_against_twin, check_compiles_whole

from brickwork.kernels import masked_softmax, masked_softmax_ref
from brickwork.kernels.fused.masked_softmax import masked_softmax_triton


def _scores(shape, device, dtype=torch.float32):
    return (torch.randn(shape, device=device) * 3).to(dtype).requires_grad_()


def _triton(scale=0.7, causal=False, max_block=None):
    if max_block is None:
        return lambda s, m: masked_softmax(s, m, scale, causal, backend="triton")
    return lambda s, m: masked_softmax_triton(s, m, scale, causal, max_block=max_block)


def _twin(scale=0.7, causal=False):
    return lambda s, m: masked_softmax_ref(s, m, scale, causal)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [1, 7, 127, 1000])
def test_widths(device, n):
    check_against_twin(_triton(), _twin(), [_scores((2, 3, 4, n), device), None], torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
def test_rows_wider_than_a_block_take_the_online_path(device, causal):
    args = [_scores((1, 2, 3, 1000), device), None]
    check_against_twin(_triton(causal=causal, max_block=256), _twin(causal=causal), args, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("max_block", [None, 16])
@pytest.mark.parametrize("mask_shape", [(2, 1, 5, 40), (5, 40), (1, 3, 1, 40)])
def test_boolean_mask_broadcast(device, max_block, mask_shape):
    mask = torch.rand(mask_shape, device=device) > 0.4
    args = [_scores((2, 3, 5, 40), device), mask]
    check_against_twin(_triton(max_block=max_block), _twin(), args, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("max_block", [None, 16])
def test_additive_mask_and_its_gradient(device, max_block):
    # A learnable [H, Tq, Tk] bias (as in relative-position schemes) gets its gradient summed over batch.
    bias = torch.randn(3, 5, 40, device=device).requires_grad_()
    args = [_scores((2, 3, 5, 40), device), bias]
    check_against_twin(_triton(max_block=max_block), _twin(), args, torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("max_block", [None, 8])
@pytest.mark.parametrize(("tq", "tk"), [(4, 9), (9, 9), (9, 4)])
def test_causal_is_bottom_right_aligned(device, max_block, tq, tk):
    args = [_scores((2, 2, tq, tk), device), None]
    y = check_against_twin(_triton(causal=True, max_block=max_block), _twin(causal=True), args, torch.float32)
    # Query i sees keys 0 .. i + tk - tq: the last query sees every key, later keys get exactly zero.
    allowed = torch.ones(tq, tk, dtype=torch.bool, device=device).tril(tk - tq)
    assert torch.equal(y.detach()[..., ~allowed], torch.zeros_like(y.detach()[..., ~allowed]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("max_block", [None, 8])
def test_fully_masked_rows_give_zeros_and_zero_gradient(device, max_block):
    scores = _scores((2, 2, 4, 30), device)
    mask = torch.rand(2, 1, 4, 30, device=device) > 0.3
    mask[:, :, 1] = False  # nothing to attend to in query row 1
    additive = torch.zeros(4, 30, device=device)
    additive[2] = float("-inf")  # nor in row 2, through a float mask
    for m in (mask, additive):
        y = _triton(max_block=max_block)(scores, m)
        (grad,) = torch.autograd.grad(y, (scores,), torch.randn_like(y))
        dead = [1] if m.dtype == torch.bool else [2]
        assert torch.isfinite(y).all() and torch.isfinite(grad).all()
        assert torch.equal(y[:, :, dead], torch.zeros_like(y[:, :, dead]))
        assert torch.equal(grad[:, :, dead], torch.zeros_like(grad[:, :, dead]))
        live = [r for r in range(4) if r not in dead]
        torch.testing.assert_close(y[:, :, live].sum(-1), torch.ones_like(y[:, :, live].sum(-1)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale", [1.0, 0.125])
@pytest.mark.parametrize("max_block", [None, 16])
def test_float16_extremes_stay_finite(device, scale, max_block):
    scores = torch.full((2, 3, 50), 65504.0, device=device)
    scores[:, 1] = -65504.0
    scores[:, 2, ::2] = -65504.0
    scores[0, 0, 7] = 65000.0
    scores = scores.half().requires_grad_()
    y = check_against_twin(
        _triton(scale=scale, max_block=max_block), _twin(scale=scale), [scores, None], torch.float16
    )
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(device, dtype):
    mask = torch.rand(5, 300, device=device) > 0.2
    check_against_twin(
        _triton(causal=True), _twin(causal=True), [_scores((2, 5, 300), device, dtype), mask], dtype
    )


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_scores_and_other_ranks(device):
    transposed = _scores((2, 7, 3, 6), device).transpose(1, 2)  # [B, H, Tq, Tk] view of a [B, Tq, H, Tk]
    assert not transposed.is_contiguous()
    check_against_twin(_triton(causal=True), _twin(causal=True), [transposed, None], torch.float32)
    five_d = _scores((2, 2, 3, 4, 9), device)
    mask = torch.rand(2, 1, 1, 4, 9, device=device) > 0.3
    check_against_twin(_triton(), _twin(), [five_d, mask], torch.float32)
    check_against_twin(_triton(), _twin(), [_scores((13,), device), None], torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [4096, 32768, 65536])
def test_long_rows_on_gpu(dtype, n):
    check_against_twin(
        _triton(causal=True), _twin(causal=True), [_scores((1, 4, 16, n), "cuda", dtype), None], dtype
    )


@pytest.mark.gpu
def test_compiles_without_graph_breaks_on_gpu():
    scores = _scores((2, 4, 64, 64), "cuda", torch.bfloat16)
    mask = torch.rand(2, 1, 64, 64, device="cuda") > 0.1
    kernel = lambda s, m: masked_softmax(s, m, 0.125, True)
    check_compiles_whole(kernel, _twin(0.125, causal=True), [scores, mask], torch.bfloat16)


def test_twin_matches_the_formula_in_float64():
    s = torch.randn(2, 3, 4, 6, dtype=torch.float64)
    bias = torch.randn(4, 6, dtype=torch.float64)
    keep = torch.rand(2, 1, 4, 6) > 0.3
    keep[..., 0] = True

    def softmax(logits):
        e = (logits - logits.amax(-1, keepdim=True)).exp()
        return e / e.sum(-1, keepdim=True)

    expected_bool = softmax((s * 0.5).masked_fill(~keep, float("-inf")))
    torch.testing.assert_close(masked_softmax_ref(s, keep, 0.5), expected_bool, rtol=1e-12, atol=1e-12)
    expected_float = softmax(s * 0.5 + bias)
    torch.testing.assert_close(masked_softmax_ref(s, bias, 0.5), expected_float, rtol=1e-12, atol=1e-12)
    # Causal with Tk = Tq + 2: query i sees keys 0 .. i + 2.
    causal = torch.ones(4, 6, dtype=torch.bool).tril(2)
    expected_causal = softmax(s.masked_fill(~causal, float("-inf")))
    torch.testing.assert_close(masked_softmax_ref(s, causal=True), expected_causal, rtol=1e-12, atol=1e-12)


def test_twin_gradcheck_with_a_dead_row():
    s = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(2, 3, 5) > 0.3
    mask[0, 1] = False
    assert torch.autograd.gradcheck(lambda s: masked_softmax_ref(s, mask, 0.3, causal=True), (s,))


def test_bad_inputs_raise_clear_errors():
    s = torch.randn(2, 4, 5)
    with pytest.raises(
        ValueError, match=r"mask of shape \(3, 5\) does not broadcast to scores of shape \(2, 4, 5\)"
    ):
        masked_softmax(s, torch.ones(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"does not broadcast"):
        masked_softmax(s, torch.ones(7, 2, 4, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match=r"mask has dtype torch.int64"):
        masked_softmax(s, torch.ones(4, 5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"causal=True needs scores of shape"):
        masked_softmax(torch.randn(5), causal=True)
    with pytest.raises(ValueError, match=r"non-empty last dimension"):
        masked_softmax(torch.randn(3, 0))


def test_cpu_default_is_the_twin():
    s, mask = torch.randn(2, 3, 4, 5), torch.rand(4, 5) > 0.5
    assert torch.equal(masked_softmax(s, mask, 0.5, True), masked_softmax_ref(s, mask, 0.5, True))
    assert_matches(masked_softmax(s), torch.softmax(s.double(), -1), torch.float32, "plain softmax")
