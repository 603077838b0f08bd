"""The experts bank as grouped GEMMs (torch's grouped_mm, which runs on CPU in fp32) against its loop."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from brickwork.components.feedforward import GLU, MLP, ConvMLP, MixtureOfExperts, grouped_experts
from brickwork.components.feedforward.grouped_experts import use_grouped_mm
from brickwork.components.feedforward.moe import Experts

COUNTS = [5, 0, 9, 2]  # expert 1 gets no row: its gradient must still be zero, not missing


def bank_of(expert: str, **options: object) -> Experts:
    return MixtureOfExperts(32, num_experts=len(COUNTS), hidden_dim=64, expert=expert, **options).experts


@pytest.mark.parametrize("loss", ["probe", "sum"])  # sum: the gradient arrives with zero strides
@pytest.mark.parametrize(
    ("expert", "options"),
    [
        ("mlp", {}),
        ("mlp", {"activation": "squared_relu", "bias": False}),
        ("swiglu", {"bias": False}),
        ("glu", {"bias": True}),
    ],
)
def test_grouped_bank_equals_the_loop_forward_and_backward(
    expert: str, options: dict, loss: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    loop = bank_of(expert, **options)
    grouped = copy.deepcopy(loop)
    loop.grouped, grouped.grouped = False, True
    rows = torch.randn(sum(COUNTS), 32)
    counts = torch.tensor(COUNTS)
    probe = torch.randn(sum(COUNTS), 32)
    calls = []
    kernel = F.grouped_mm
    monkeypatch.setattr(F, "grouped_mm", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    results = []
    for bank in (loop, grouped):
        x = rows.clone().requires_grad_()
        out = bank(x, counts)
        (out * probe if loss == "probe" else out).sum().backward()
        results.append((out, x.grad, {n: p.grad for n, p in bank.named_parameters()}))
    assert len(calls) == len(grouped[0].projections())  # one grouped GEMM per projection, none in the loop
    (out, grad, params), (out_g, grad_g, params_g) = results
    # The bias gradient is the per-expert sum, not indexing's scatter-add of every row.
    steps = backward_steps(out_g)
    assert ("ExpertBiasBackward" in steps) == (grouped[0].up_proj.bias is not None)
    assert not any(step.startswith("Index") for step in steps)
    torch.testing.assert_close(out_g, out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_g, grad, rtol=1e-5, atol=1e-5)
    assert params_g.keys() == params.keys()
    for name, expected in params.items():
        torch.testing.assert_close(params_g[name], expected, rtol=1e-5, atol=1e-5, msg=name)
    assert all((p.grad == 0).all() for p in grouped[1].parameters())


def backward_steps(out: torch.Tensor) -> set[str]:
    """The names of the autograd nodes ``out`` depends on."""
    steps, todo = set(), [out.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and type(node).__name__ not in steps:
            steps.add(type(node).__name__)
            todo.extend(next_node for next_node, _ in node.next_functions)
    return steps


def test_mixture_of_experts_with_a_grouped_bank_equals_the_loop() -> None:
    torch.manual_seed(0)
    moe = MixtureOfExperts(32, num_experts=4, top_k=2, hidden_dim=64, expert="swiglu")
    x = torch.randn(2, 16, 32)
    moe.experts.grouped = False
    expected = moe(x)
    moe.experts.grouped = True
    torch.testing.assert_close(moe(x), expected, rtol=1e-5, atol=1e-5)


def hooked(bank: Experts) -> Experts:
    bank[0].up_proj.register_forward_hook(lambda *args: None)  # as a wrapper that must see the call
    return bank


def subclassed() -> Experts:
    class OwnForward(MLP):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x)

    return Experts([OwnForward(32, 64) for _ in COUNTS])


def mixed_activations(bank: Experts) -> Experts:
    return Experts([*list(bank)[:3], MLP(32, 64, activation="relu")])


@pytest.mark.parametrize(
    ("make", "dtype", "grouped"),
    [
        (lambda: bank_of("mlp"), torch.float32, None),  # default: CUDA's fast kernel only
        (lambda: bank_of("mlp"), torch.float32, False),
        (lambda: bank_of("mlp"), torch.float64, True),  # not a dtype the kernel takes
        # rows of 30 fp32 (120 bytes), hidden rows of 66 (264 bytes): not multiples of 16 bytes
        (lambda: MixtureOfExperts(30, num_experts=4, hidden_dim=64).experts, torch.float32, True),
        (lambda: MixtureOfExperts(32, num_experts=4, hidden_dim=66).experts, torch.float32, True),
        (lambda: hooked(bank_of("mlp")), torch.float32, True),
        (subclassed, torch.float32, True),
        (lambda: mixed_activations(bank_of("mlp")), torch.float32, True),
        (lambda: Experts([ConvMLP(32, 64) for _ in COUNTS]), torch.float32, True),
    ],
)
def test_the_loop_runs_where_the_grouped_kernel_does_not_apply(
    make: Callable[[], Experts], dtype: torch.dtype, grouped: bool | None
) -> None:
    bank = make().to(dtype)
    rows = torch.randn(sum(COUNTS), bank[0].dim_model, dtype=dtype)
    assert not use_grouped_mm(list(bank), rows, grouped)


def test_grouped_applies_to_an_aligned_bank_and_its_subclass_kinds() -> None:
    rows = torch.randn(sum(COUNTS), 32)
    for expert in ("mlp", "glu", "swiglu", "geglu"):
        bank = bank_of(expert)
        assert use_grouped_mm(list(bank), rows, True) and isinstance(bank[0], MLP | GLU)
        assert use_grouped_mm(list(bank), rows.bfloat16(), True)


@pytest.mark.parametrize(
    ("bias", "grouped", "groups"),
    [(False, None, True), (True, None, False), (False, True, True), (True, True, True)],
)
def test_where_the_fast_kernel_runs_the_automatic_choice_groups_only_bias_free_experts(
    bias: bool, grouped: bool | None, groups: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(grouped_experts, "fast_grouped_kernel", lambda rows: True)
    calls = []
    kernel = F.grouped_mm
    monkeypatch.setattr(F, "grouped_mm", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    bank = bank_of("swiglu", bias=bias)
    bank.grouped = grouped
    bank(torch.randn(sum(COUNTS), 32), torch.tensor(COUNTS))
    assert len(calls) == (len(bank[0].projections()) if groups else 0)


def test_the_benchmark_times_both_providers_on_the_same_rows() -> None:
    from brickwork.benchmarks.moe_experts import run

    rows = run(
        tokens=64, dim=32, hidden=64, experts=4, top_k=2, expert="swiglu", warmup=0, repeats=1, bias=False
    )
    assert [(row["provider"], row["bias"]) for row in rows] == [("grouped", False), ("loop", False)]
    assert all(row["ms"] > 0 for row in rows) and max(row["max_abs_diff"] for row in rows) < 1e-5


# Where grouped_mm's fast kernel runs, and so the bank's automatic choice groups: NVIDIA 9.x and 10.x.
FAST_KERNEL_GPU = torch.cuda.is_available() and torch.version.hip is None
FAST_KERNEL_GPU = FAST_KERNEL_GPU and torch.cuda.get_device_capability()[0] in (9, 10)


@pytest.mark.gpu
@pytest.mark.skipif(not FAST_KERNEL_GPU, reason="needs an NVIDIA GPU of capability 9.x or 10.x")
@pytest.mark.parametrize(("bias", "grouped"), [(False, None), (True, True)])
def test_on_a_gpu_the_grouped_path_runs_and_equals_the_loop(bias: bool, grouped: bool | None) -> None:
    """bf16 on CUDA, where ``grouped=None`` takes grouped_mm for bias-free experts (and ``True`` for
    biased ones): outputs and gradients within bf16's rounding of the loop's, at widths the fast
    kernel takes (multiples of 16 bytes)."""
    torch.manual_seed(0)
    moe = MixtureOfExperts(256, num_experts=4, hidden_dim=512, expert="swiglu", bias=bias).cuda()
    moe.experts.grouped = grouped
    loop = copy.deepcopy(moe.experts)
    loop.grouped = False
    counts = torch.tensor([300, 0, 125, 87], device="cuda")
    rows = torch.randn(int(counts.sum()), 256, device="cuda")
    assert use_grouped_mm(list(moe.experts), rows.bfloat16(), moe.experts.grouped)
    results = []
    for bank in (moe.experts, loop):
        x = rows.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = bank(x, counts)
        out.float().square().mean().backward()
        results.append((out.float(), x.grad, [p.grad for p in bank.parameters()]))
    (out_g, grad_g, params_g), (out, grad, params) = results
    torch.testing.assert_close(out_g, out, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(grad_g, grad, rtol=2e-2, atol=2e-3)
    for expected, got in zip(params, params_g, strict=True):
        torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-3)
