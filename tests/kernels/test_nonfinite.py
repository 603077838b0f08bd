"""NaN and infinities: every Triton kernel puts them where its float64 twin does, forward and backward.

Non-finite values sit in the input and in the upstream gradient, in positions a mask hides and in
positions it keeps, on the one-block and the looped paths. A row with nothing left to attend to still
gives zeros and zero gradient, and a row whose only non-finite scores are hidden is unaffected.
"""

import pytest
import torch
from kernel_testing import DEVICES, check_nonfinite_against_twin

from brickwork import kernels
from brickwork.kernels.fused.bias_gelu import bias_gelu_triton
from brickwork.kernels.fused.layer_norm import layer_norm_triton
from brickwork.kernels.fused.masked_softmax import masked_softmax_triton
from brickwork.kernels.fused.rms_norm import rms_norm_triton

# The interpreter computes with numpy, which warns on every inf - inf; that is what is being tested.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

NAN, INF = float("nan"), float("inf")


def _poisoned(shape, device, where, *, leaf=True):
    """Random values with NaN, +inf and -inf written at ``where`` (a list of index tuples, in that order)."""
    t = torch.randn(shape, device=device)
    for index, value in zip(where, (NAN, INF, -INF), strict=False):
        t[index] = value
    return t.requires_grad_() if leaf else t


# Rows 0-2 hold one NaN, +inf and -inf each in x; rows 3-5 are finite. In dy the bad values are elsewhere.
X_BAD = [(0, 3), (1, 5), (2, 0)]
DY_BAD = [(4, 2), (5, 6), (3, 0)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("max_block", [16384, 8])
@pytest.mark.parametrize("poison", ["x", "dy"])
def test_layer_norm(device, max_block, poison):
    x = _poisoned((6, 37), device, X_BAD if poison == "x" else [])
    dy = _poisoned((6, 37), device, DY_BAD if poison == "dy" else [], leaf=False)
    w, b = torch.randn(37, device=device).requires_grad_(), torch.randn(37, device=device).requires_grad_()
    check_nonfinite_against_twin(
        lambda x, w, b: layer_norm_triton(x, w, b, 1e-5, max_block=max_block),
        lambda x, w, b: kernels.layer_norm_ref(x, w, b, 1e-5),
        [x, w, b],
        dy,
        # An infinite dy makes the row sums infinite; the kernel then gives a NaN row, the twin NaN and inf.
        exact_nan=poison == "x",
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("width", "max_block"), [(37, 16384), (37, 8), (1, 16384)])
@pytest.mark.parametrize("poison", ["x", "dy"])
def test_rms_norm(device, width, max_block, poison):
    x_bad = X_BAD if width > 1 else [(0, 0), (1, 0), (2, 0)]
    dy_bad = DY_BAD if width > 1 else [(4, 0), (5, 0), (3, 0)]
    x = _poisoned((6, width), device, x_bad if poison == "x" else [])
    dy = _poisoned((6, width), device, dy_bad if poison == "dy" else [], leaf=False)
    w = torch.randn(width, device=device).requires_grad_()
    check_nonfinite_against_twin(
        lambda x, w: rms_norm_triton(x, w, 1e-6, max_block=max_block),
        lambda x, w: kernels.rms_norm_ref(x, w, 1e-6),
        [x, w],
        dy,
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("p", [0.0, 0.5])
@pytest.mark.parametrize("poison", ["x", "dy", "bias"])
def test_bias_gelu_and_dropout(device, approximate, p, poison):
    # With p = 0.5 about half of the non-finite values are dropped: those give 0 and no gradient.
    x = _poisoned((6, 37), device, X_BAD if poison == "x" else [])
    dy = _poisoned((6, 37), device, DY_BAD if poison == "dy" else [], leaf=False)
    bias = _poisoned((37,), device, [(4,), (9,), (30,)] if poison == "bias" else [])
    check_nonfinite_against_twin(
        lambda x, b: bias_gelu_triton(x, b, approximate, p, 5, max_tile=64),
        lambda x, b: kernels.bias_gelu_dropout_ref(x, b, p, 5, approximate),
        [x, bias],
        dy,
    )


def _softmax_pair(scale, causal, max_block):
    return (
        lambda s, m: masked_softmax_triton(s, m, scale, causal, max_block=max_block),
        lambda s, m: kernels.masked_softmax_ref(s, m, scale, causal),
    )


def _mask(kind, device):
    """[5, 12] masks: bool (False = hidden) with column 1 and row 4 hidden, or additive with -inf there."""
    keep = torch.ones(5, 12, dtype=torch.bool, device=device)
    keep[:, 1] = False
    keep[4] = False  # a dead row
    if kind == "bool":
        return keep
    additive = torch.randn(5, 12, device=device).masked_fill(~keep, -INF)
    additive[2, 7] = NAN  # a NaN in the mask itself poisons its row
    return additive


# Scores [2, 2, 5, 12]: NaN, +inf and -inf in hidden column 1 (rows 0-2) and in kept columns (rows 1-3).
SCORE_BAD = {
    "hidden": [(0, 0, 0, 1), (0, 1, 1, 1), (1, 0, 2, 1)],
    "kept": [(0, 0, 1, 3), (1, 1, 2, 8), (0, 1, 3, 0)],
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
@pytest.mark.parametrize("where", ["hidden", "kept", "dy"])
@pytest.mark.parametrize(("causal", "max_block"), [(False, 16384), (True, 4)])
def test_masked_softmax(device, mask_kind, where, causal, max_block):
    scores = _poisoned((2, 2, 5, 12), device, SCORE_BAD.get(where, []))
    dy_bad = SCORE_BAD["hidden"] + SCORE_BAD["kept"] if where == "dy" else []
    dy = _poisoned((2, 2, 5, 12), device, dy_bad, leaf=False)
    mask = None if mask_kind == "none" else _mask(mask_kind, device)
    kernel, twin = _softmax_pair(0.5, causal, max_block)
    check_nonfinite_against_twin(kernel, twin, [scores, mask], dy)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("max_block", [16384, 2, None])
def test_the_reported_rows(device, max_block):
    # A NaN or +inf score makes the whole row NaN, as torch.softmax does, instead of a row summing to 4.5.
    # max_block None is the public function's torch backend, the twin.
    def softmax(scores, mask):
        if max_block is None:
            return kernels.masked_softmax(scores, mask, backend="torch")
        return masked_softmax_triton(scores, mask, 1.0, False, max_block=max_block)

    scores = torch.tensor([[0.5, 1.0, NAN, -0.3, 0.2], [0.5, 1.0, INF, -0.3, 0.2]], device=device)
    y = softmax(scores, None)
    assert y.isnan().all()
    # Hidden by a bool mask, the same values change nothing.
    keep = torch.tensor([True, True, False, True, True], device=device)
    y = softmax(scores, keep)
    expected = torch.softmax(scores[:, [0, 1, 3, 4]], dim=-1)
    torch.testing.assert_close(y[:, [0, 1, 3, 4]], expected)
    assert torch.equal(y[:, 2], torch.zeros(2, device=device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("max_block", [16384, 4])
def test_dead_rows_give_zero_gradient_whatever_dy_holds(device, max_block):
    scores = torch.randn(3, 10, device=device).requires_grad_()
    keep = torch.ones(3, 10, dtype=torch.bool, device=device)
    keep[1] = False
    dy = torch.full((3, 10), NAN, device=device)
    y = masked_softmax_triton(scores, keep, 1.0, False, max_block=max_block)
    (grad,) = torch.autograd.grad(y, scores, dy)
    assert torch.equal(y[1], torch.zeros(10, device=device))
    assert torch.equal(grad[1], torch.zeros(10, device=device)) and grad[[0, 2]].isnan().all()
