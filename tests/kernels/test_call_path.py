"""The Triton call path: eager calls skip the torch.library ops, compiling calls use them, same numbers.

An eager call runs a plain ``autograd.Function`` whose forward and backward launch the kernels
directly; while ``torch.compile`` traces, the same launchers run inside the ``torch.library`` ops.
On CPU, Dynamo's fake-tensor pass cannot trace an interpreted kernel (torch's ``wrap_triton`` hands it
back unwrapped, so it would run on FakeTensors), so the compiling branch is driven here by making
``torch.compiler.is_compiling`` answer True, and the real compile runs in the gpu-marked test.
"""

import pytest
import torch
from kernel_testing import DEVICES
from torch.utils._python_dispatch import TorchDispatchMode

from brickwork import kernels


class _OpLog(TorchDispatchMode):
    """Records the name of every op that reaches the dispatcher."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def _cases(device):
    x = torch.randn(6, 40, device=device)
    w = torch.randn(40, device=device)
    scores = torch.randn(2, 3, 5, 40, device=device)
    mask = torch.rand(5, 40, device=device) > 0.3
    return {
        "layer_norm": (lambda x, w, b: kernels.layer_norm(x, w, b, backend="triton"), [x, w, w.clone()]),
        "rms_norm": (lambda x, w: kernels.rms_norm(x, w, backend="triton"), [x, w]),
        "bias_gelu": (lambda x, b: kernels.bias_gelu(x, b, "tanh", backend="triton"), [x, w]),
        "bias_gelu_dropout": (
            lambda x, b: kernels.bias_gelu_dropout(x, b, 0.3, 11, backend="triton"),
            [x, w],
        ),
        "masked_softmax": (
            lambda s, m: kernels.masked_softmax(s, m, 0.5, causal=True, backend="triton"),
            [scores, mask],
        ),
    }


KERNELS = ["layer_norm", "rms_norm", "bias_gelu", "bias_gelu_dropout", "masked_softmax"]


def _run(fn, args):
    """Forward and backward under an op log: (output, input gradients, names of the dispatched ops)."""
    leaves = [a.clone().requires_grad_() if a.is_floating_point() else a for a in args]
    with _OpLog() as log:
        out = fn(*leaves)
        grads = torch.autograd.grad(out, [a for a in leaves if a.requires_grad], torch.ones_like(out))
    return out, grads, log.names


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", KERNELS)
def test_eager_skips_the_library_op_and_compiling_uses_it_with_equal_results(device, name, monkeypatch):
    fn, args = _cases(device)[name]
    eager_out, eager_grads, eager_ops = _run(fn, args)
    assert not [op for op in eager_ops if op.startswith("brickwork.")], eager_ops
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    op_out, op_grads, op_ops = _run(fn, args)
    op_name = name.removesuffix("_dropout")
    assert f"brickwork.{op_name}_fwd.default" in op_ops
    assert f"brickwork.{op_name}_bwd.default" in op_ops
    assert torch.equal(eager_out, op_out)
    for a, b in zip(eager_grads, op_grads, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", KERNELS)
def test_calls_with_nothing_to_differentiate_give_the_same_output_without_a_graph(device, name):
    fn, args = _cases(device)[name]
    with_grad, _, _ = _run(fn, args)
    with torch.no_grad():
        plain = fn(*args)
    assert plain.grad_fn is None and torch.equal(plain, with_grad)


def test_launch_parameters_are_cached_per_width():
    from brickwork.kernels.fused.launch import row_launch

    row_launch.cache_clear()
    kernels.layer_norm(torch.randn(3, 100), None, None, backend="triton")
    kernels.layer_norm(torch.randn(5, 100), None, None, backend="triton")
    info = row_launch.cache_info()
    assert (info.misses, info.hits) == (1, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("name", KERNELS)
def test_compile_sees_each_op_without_a_graph_break(name):
    fn, args = _cases("cuda")[name]
    leaves = [a.clone().requires_grad_() if a.is_floating_point() else a for a in args]
    explanation = torch._dynamo.explain(lambda *a: fn(*a).sum())(*leaves)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    op_name = name.removesuffix("_dropout")
    assert f"brickwork.{op_name}_fwd" in str(explanation.graphs[0].code)


def test_default_backend_takes_the_twin_while_compiling(monkeypatch):
    # Inductor fuses the twins with their neighbours; an explicit backend="triton" still gets the op.
    from types import SimpleNamespace

    from brickwork.kernels.backend import TRITON_INSTALLED, rms_norm_uses_triton, use_triton

    cuda_tensor = SimpleNamespace(is_cuda=True)
    assert use_triton(None, cuda_tensor) is TRITON_INSTALLED
    # RMSNorm's default is its twin in eager mode too; asked for, the kernel runs.
    assert rms_norm_uses_triton(None, cuda_tensor) is False
    assert rms_norm_uses_triton("triton", cuda_tensor) is True
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert use_triton(None, cuda_tensor) is False
    assert use_triton("triton", cuda_tensor) is True
    assert rms_norm_uses_triton("triton", cuda_tensor) is True


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_a_norm_module_compiles_the_triton_op_only_when_its_backend_says_triton(device, norm, monkeypatch):
    # The per-op switch under torch.compile: a norm's ``backend`` option (docs/kernels.md).
    from brickwork.components.residual import NORM_REGISTRY

    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    x = torch.randn(6, 40, device=device)
    outputs = {}
    for backend in (None, "triton"):
        module = NORM_REGISTRY.build(norm, "norm", dim=40, backend=backend).to(device)
        outputs[backend], _, ops = _run(module, [x])
        library_ops = {op for op in ops if op.startswith("brickwork.")}
        op_name = {"layernorm": "layer_norm", "rmsnorm": "rms_norm"}[norm]
        expected = {f"brickwork.{op_name}_fwd.default", f"brickwork.{op_name}_bwd.default"}
        assert library_ops == (expected if backend == "triton" else set())
    torch.testing.assert_close(outputs["triton"], outputs[None], rtol=1e-5, atol=1e-5)
