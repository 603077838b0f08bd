"""LayerNorm and RMSNorm against torch.nn.LayerNorm and a float64 formula; the norm registry contract."""

from __future__ import annotations

import pytest
import torch

from brickwork import kernels
from brickwork.components.residual import NORM_REGISTRY, LayerNorm, RMSNorm
from brickwork.errors import ConfigError


@pytest.mark.parametrize("name", NORM_REGISTRY.keys())
def test_shape_gradients_and_from_config(name: str) -> None:
    cls = NORM_REGISTRY.get(name)
    norm = cls(dim=7)
    assert type(cls.from_config(cls.Config(dim=7))) is cls
    with torch.no_grad():
        for p in norm.parameters():
            p.normal_()
    x = torch.randn(2, 3, 7, requires_grad=True)
    y = norm(x)
    assert y.shape == x.shape
    (y * torch.randn_like(y)).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for pname, p in norm.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("name", NORM_REGISTRY.keys())
@pytest.mark.parametrize(("option", "value"), [("dim", 0), ("eps", 0.0), ("backend", "cuda")])
def test_bad_options_name_the_option(name: str, option: str, value: object) -> None:
    with pytest.raises(ConfigError, match=option):
        NORM_REGISTRY.get(name)(**{"dim": 4, option: value})


@pytest.mark.parametrize("name", NORM_REGISTRY.keys())
def test_wrong_width_raises_value_error(name: str) -> None:
    with pytest.raises(ValueError, match=r"dim=4.*\(2, 5\)"):
        NORM_REGISTRY.get(name)(dim=4)(torch.zeros(2, 5))


@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_matches_torch(bias: bool) -> None:
    torch.manual_seed(0)
    ours = LayerNorm(10, eps=1e-3, bias=bias)
    theirs = torch.nn.LayerNorm(10, eps=1e-3, bias=bias)
    with torch.no_grad():
        ours.weight.normal_()
        theirs.weight.copy_(ours.weight)
        if bias:
            ours.bias.normal_()
            theirs.bias.copy_(ours.bias)
    assert (ours.bias is None) == (not bias)
    x = torch.randn(3, 4, 10)
    torch.testing.assert_close(ours(x), theirs(x))
    assert set(dict(ours.named_parameters())) == set(dict(theirs.named_parameters()))


def test_rms_norm_matches_float64_formula() -> None:
    torch.manual_seed(0)
    norm = RMSNorm(10, eps=1e-4).double()
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(3, 4, 10, dtype=torch.float64)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-4) * norm.weight
    torch.testing.assert_close(norm(x), expected)
    assert [n for n, _ in norm.named_parameters()] == ["weight"]


def test_norms_call_the_kernels_with_their_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, object]] = []
    real_layer_norm, real_rms_norm = kernels.layer_norm, kernels.rms_norm

    def layer_norm(*args: object, backend: str | None = None) -> torch.Tensor:
        calls.append(("layer_norm", backend))
        return real_layer_norm(*args, backend=backend)

    def rms_norm(*args: object, backend: str | None = None) -> torch.Tensor:
        calls.append(("rms_norm", backend))
        return real_rms_norm(*args, backend=backend)

    monkeypatch.setattr(kernels, "layer_norm", layer_norm)
    monkeypatch.setattr(kernels, "rms_norm", rms_norm)
    # bfloat16: the twin upcasts it, so the kernel function is called (float32 on CPU is torch's norm
    # itself, called directly: test_float32_off_triton_is_the_twin_bit_for_bit).
    LayerNorm(4, backend="torch").bfloat16()(torch.randn(2, 4, dtype=torch.bfloat16))
    RMSNorm(4).bfloat16()(torch.randn(2, 4, dtype=torch.bfloat16))
    assert calls == [("layer_norm", "torch"), ("rms_norm", None)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float32_off_triton_is_the_twin_bit_for_bit(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16, dtype=dtype, requires_grad=True)
    for norm, twin in (
        (LayerNorm(16).to(dtype), lambda m, t: kernels.layer_norm(t, m.weight, m.bias, m.eps)),
        (RMSNorm(16).to(dtype), lambda m, t: kernels.rms_norm(t, m.weight, m.eps)),
    ):
        with torch.no_grad():
            norm.weight.normal_()
        out, want = norm(x), twin(norm, x)
        assert torch.equal(out, want)
        grads = torch.autograd.grad(out.sum(), [x, norm.weight])
        want_grads = torch.autograd.grad(want.sum(), [x, norm.weight])
        assert all(torch.equal(a, b) for a, b in zip(grads, want_grads))
