"""Shared pieces of the kernel tests: devices, per-dtype tolerances, and checks against float64 twins.

Every Triton result is compared with its torch twin evaluated in float64 on the CPU, on the same
(rounded) inputs, so the tolerance only has to cover the kernel's own float32 arithmetic and the final
rounding:

- float32: rtol = atol = 1e-5 (atol scaled by the largest reference value when that exceeds 1).
- float16: one to two fp16 ulps (2**-11 relative): rtol = atol = 2e-3.
- bfloat16: numpy has no bfloat16, so Triton's interpreter computes in float32 and truncates on the
  final store instead of rounding to nearest, which can cost a second bf16 ulp (2**-8 relative):
  rtol = atol = 1.6e-2. What is checked for bf16 on CPU is the float32 math and the store path; the
  gpu-marked runs check true bf16 rounding on compiled Triton with the same tolerance.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from brickwork.kernels.backend import triton_interpreted

# True when this process runs Triton kernels through the interpreter (CPU tensors allowed).
INTERPRETED = triton_interpreted()

# With CUDA present triton compiles for the GPU (the interpreter is off process-wide) and the same
# cases run through the "cuda" param; without CUDA the "cpu" param must run, so it is never skipped there.
DEVICES = [
    pytest.param(
        "cpu",
        marks=pytest.mark.skipif(
            torch.cuda.is_available() and not INTERPRETED,
            reason="triton compiles for the GPU in this process; the cuda params run these cases",
        ),
    ),
    pytest.param("cuda", marks=pytest.mark.gpu),
]

TOLERANCES = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """``actual`` (computed in ``dtype``) agrees with the float64 ``expected`` within ``TOLERANCES``."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    tol = TOLERANCES[dtype]
    scale = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
    torch.testing.assert_close(
        actual.double().cpu(),
        expected.double().cpu(),
        rtol=tol,
        atol=tol * scale,
        msg=lambda m: f"{what}: {m}",
    )


def to_reference(t: torch.Tensor | None) -> torch.Tensor | None:
    """A float64 leaf copy on the CPU (bool tensors keep their dtype).

    The twins run on the CPU for every device, so a GPU result meets the same reference as an
    interpreted one (torch's own CUDA kernels need not put NaN and infinities where its CPU ones do).
    """
    if t is None:
        return None
    if t.dtype == torch.bool:
        return t.detach().cpu().clone()
    return t.detach().cpu().double().requires_grad_(t.requires_grad)


def check_against_twin(
    kernel: Callable[..., torch.Tensor],
    twin: Callable[..., torch.Tensor],
    args: list[torch.Tensor | None],
    dtype: torch.dtype,
) -> torch.Tensor:
    """Run ``kernel(*args)`` forward and backward and compare both with ``twin`` on float64 copies.

    Gradients are taken with respect to every arg that requires grad (views included) for a random
    upstream gradient. Returns the kernel's output.
    """
    out = kernel(*args)
    assert out.dtype == args[0].dtype, f"output dtype {out.dtype} != input dtype {args[0].dtype}"
    ref_args = [to_reference(a) for a in args]
    ref = twin(*ref_args)
    assert_matches(out, ref, dtype, "forward")
    wrt = [i for i, a in enumerate(args) if a is not None and a.requires_grad]
    if wrt:
        dy = torch.randn_like(out)
        grads = torch.autograd.grad(out, [args[i] for i in wrt], dy)
        ref_grads = torch.autograd.grad(ref, [ref_args[i] for i in wrt], dy.double().cpu())
        for i, grad, ref_grad in zip(wrt, grads, ref_grads, strict=True):
            assert_matches(grad, ref_grad, dtype, f"gradient of argument {i}")
    return out


def check_compiles_whole(
    kernel: Callable[..., torch.Tensor],
    twin: Callable[..., torch.Tensor],
    args: list[torch.Tensor | None],
    dtype: torch.dtype,
) -> None:
    """``sum(kernel(*args) ** 2)`` compiles into one graph (``fullgraph``), and its value and gradients
    match the float64 twin's within ``TOLERANCES[dtype]``.

    The compiled function may keep a low-precision output in float32 where the eager kernel rounds it,
    so the compiled result is held to the twin, not to the eager kernel's own rounding.
    """
    loss = torch.compile(lambda *a: kernel(*a).float().square().sum(), fullgraph=True)(*args)
    ref_args = [to_reference(a) for a in args]
    ref_loss = twin(*ref_args).square().sum()
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(loss.double().cpu(), ref_loss.detach(), rtol=tol, atol=0.0)
    wrt = [i for i, a in enumerate(args) if a is not None and a.requires_grad]
    grads = torch.autograd.grad(loss, [args[i] for i in wrt])
    ref_grads = torch.autograd.grad(ref_loss, [ref_args[i] for i in wrt])
    for i, grad, ref_grad in zip(wrt, grads, ref_grads, strict=True):
        assert_matches(grad, ref_grad, dtype, f"compiled gradient of argument {i}")


def assert_same_values(
    actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str, exact_nan: bool = True
) -> None:
    """NaN and infinities where ``expected`` has them, finite values within ``TOLERANCES``.

    ``exact_nan=False`` lets an entry that is ±inf in ``expected`` be NaN in ``actual`` (and only that):
    for ``inf - inf`` inside a row sum, which entries come out NaN rather than infinite depends on how
    the sums are arranged, which the formula leaves open.
    """
    actual, expected = actual.double().cpu(), expected.double().cpu()
    for test in (torch.isfinite, torch.isnan) if exact_nan else (torch.isfinite,):
        assert torch.equal(test(actual), test(expected)), _differing(actual, expected, test, what)
    if not exact_nan:
        assert actual.isnan()[expected.isnan()].all(), f"{what}: a NaN of the reference is not NaN"
        actual = torch.where(actual.isnan() & expected.isinf(), expected, actual)
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(
        actual, expected, rtol=tol, atol=tol, equal_nan=True, msg=lambda m: f"{what}: {m}"
    )


def _differing(actual: torch.Tensor, expected: torch.Tensor, test: Callable, what: str) -> str:
    """Where ``test`` (isfinite or isnan) tells ``actual`` from ``expected``: the first few places."""
    where = (test(actual) != test(expected)).nonzero().tolist()
    shown = ", ".join(
        f"{tuple(i)}: {actual[tuple(i)].item()} vs {expected[tuple(i)].item()}" for i in where[:6]
    )
    return f"{what}: {test.__name__} differs at {len(where)} entries, e.g. {shown}"


def check_nonfinite_against_twin(
    kernel: Callable[..., torch.Tensor],
    twin: Callable[..., torch.Tensor],
    args: list[torch.Tensor | None],
    dy: torch.Tensor,
    exact_nan: bool = True,
) -> torch.Tensor:
    """Like :func:`check_against_twin` for float32 inputs that hold NaN or infinities, with a given ``dy``.

    Forward and gradients must put NaN and infinities where the float64 twin does (see
    :func:`assert_same_values` for ``exact_nan``; the forward is always exact).
    """
    out = kernel(*args)
    ref_args = [to_reference(a) for a in args]
    ref = twin(*ref_args)
    assert_same_values(out, ref, torch.float32, "forward")
    wrt = [i for i, a in enumerate(args) if a is not None and a.requires_grad]
    grads = torch.autograd.grad(out, [args[i] for i in wrt], dy)
    ref_grads = torch.autograd.grad(ref, [ref_args[i] for i in wrt], dy.double().cpu())
    for i, grad, ref_grad in zip(wrt, grads, ref_grads, strict=True):
        assert_same_values(grad, ref_grad, torch.float32, f"gradient of argument {i}", exact_nan)
    return out
