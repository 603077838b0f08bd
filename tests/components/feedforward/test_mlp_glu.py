"""MLP and GLU outputs against float64 formulas written here; activation resolution; fused GELU path."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from brickwork import kernels
from brickwork.components.feedforward import (
    GLU,
    MLP,
    GeGLU,
    SwiGLU,
    create_activation,
    default_glu_hidden_dim,
)
from brickwork.components.feedforward import mlp as mlp_module
from brickwork.errors import ConfigError

FORMULAS = {
    "gelu": lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "relu": lambda x: torch.where(x > 0, x, torch.zeros_like(x)),
    "squared_relu": lambda x: torch.where(x > 0, x * x, torch.zeros_like(x)),
    "silu": lambda x: x / (1 + torch.exp(-x)),
    "leaky_relu": lambda x: torch.where(x > 0, x, 0.01 * x),
    "star_relu": lambda x: 0.8944 * torch.where(x > 0, x * x, torch.zeros_like(x)) - 0.4472,
    # beta = 2: zero below -2, (x + 2)^2 / 8 on [-2, 2], identity above.
    "smelu": lambda x: torch.where(x >= 2, x, torch.where(x <= -2, torch.zeros_like(x), (x + 2) ** 2 / 8)),
}


def affine(x: torch.Tensor, linear: torch.nn.Linear) -> torch.Tensor:
    y = x @ linear.weight.T
    return y if linear.bias is None else y + linear.bias


@pytest.mark.parametrize("activation", sorted(FORMULAS))
@pytest.mark.parametrize("bias", [True, False])
def test_mlp_matches_formula(activation: str, bias: bool) -> None:
    torch.manual_seed(0)
    mlp = MLP(6, hidden_dim=10, activation=activation, bias=bias).double()
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    expected = affine(FORMULAS[activation](affine(x, mlp.up_proj)), mlp.down_proj)
    torch.testing.assert_close(mlp(x), expected)


def test_mlp_default_hidden_dim_is_four_times_model_dim() -> None:
    mlp = MLP(6)
    assert mlp.up_proj.weight.shape == (24, 6) and mlp.down_proj.weight.shape == (6, 24)


def _spy_on_bias_gelu(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = kernels.bias_gelu

    def spy(x: torch.Tensor, bias: torch.Tensor | None, approximate: str = "none") -> torch.Tensor:
        calls.append(approximate)
        return real(x, bias, approximate)

    monkeypatch.setattr(kernels, "bias_gelu", spy)
    return calls


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
def test_mlp_gelu_with_bias_uses_fused_bias_gelu(activation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _spy_on_bias_gelu(monkeypatch)
    # Where the Triton kernel runs (a CUDA tensor); the spy then computes with the twin.
    monkeypatch.setattr(mlp_module, "use_triton", lambda backend, x: True)
    torch.manual_seed(0)
    mlp = MLP(6, hidden_dim=10, activation=activation)
    x = torch.randn(3, 6)
    fused = mlp(x)
    assert calls == [{"gelu": "none", "gelu_tanh": "tanh"}[activation]]
    # A hook on up_proj (as sharding wrappers add) must route the call through the module instead.
    mlp.up_proj.register_forward_hook(lambda module, args, out: None)
    unfused = mlp(x)
    assert len(calls) == 1
    torch.testing.assert_close(fused, unfused)


def test_mlp_on_cpu_keeps_the_bias_in_the_matmul(monkeypatch: pytest.MonkeyPatch) -> None:
    """The twin would add the bias in a pass of its own; on CPU the matmul adds it for free."""
    calls = _spy_on_bias_gelu(monkeypatch)
    torch.manual_seed(0)
    mlp = MLP(6, hidden_dim=10, activation="gelu_tanh")
    x = torch.randn(3, 6)
    torch.testing.assert_close(
        mlp(x), mlp.down_proj(torch.nn.functional.gelu(mlp.up_proj(x), approximate="tanh"))
    )
    assert calls == []


@pytest.mark.parametrize(
    ("cls", "activation"),
    [(SwiGLU, "silu"), (GeGLU, "gelu"), (functools.partial(GLU, activation="relu"), "relu")],
)
@pytest.mark.parametrize("bias", [True, False])
def test_glu_matches_formula(cls: type, activation: str, bias: bool) -> None:
    torch.manual_seed(0)
    glu = cls(6, hidden_dim=10, bias=bias).double()
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    gated = FORMULAS[activation](affine(x, glu.gate_proj)) * affine(x, glu.up_proj)
    torch.testing.assert_close(glu(x), affine(gated, glu.down_proj))


def test_glu_default_hidden_dim_keeps_mlp_parameter_count() -> None:
    assert default_glu_hidden_dim(96) == 256
    assert default_glu_hidden_dim(10) == 32  # ceil(80 / 3) = 27, rounded up to a multiple of 8
    glu = SwiGLU(96)
    assert glu.gate_proj.weight.shape == (256, 96) and glu.down_proj.weight.shape == (96, 256)
    assert glu.gate_proj.bias is None


def test_dropout_is_applied_in_training_only() -> None:
    torch.manual_seed(0)
    mlp = MLP(6, hidden_dim=64, dropout=0.5)
    x = torch.randn(4, 6)
    mlp.eval()
    torch.testing.assert_close(mlp(x), mlp(x))
    mlp.train()
    assert not torch.allclose(mlp(x), mlp(x))


def test_create_activation_accepts_names_classes_partials_modules_and_functions() -> None:
    x = torch.linspace(-3, 3, 13, dtype=torch.float64)
    torch.testing.assert_close(create_activation("squared_relu")(x), FORMULAS["squared_relu"](x))
    torch.testing.assert_close(create_activation(torch.nn.Tanh)(x), torch.tanh(x))
    torch.testing.assert_close(
        create_activation(functools.partial(torch.nn.GELU, approximate="tanh"))(x), FORMULAS["gelu_tanh"](x)
    )
    module = torch.nn.SiLU()
    assert create_activation(module) is module
    torch.testing.assert_close(create_activation(torch.sin)(x), torch.sin(x))
    mlp = MLP(4, activation=torch.nn.Tanh)
    assert isinstance(mlp.activation, torch.nn.Tanh)


def test_unknown_activation_lists_choices() -> None:
    choices = r"allowed: gelu, gelu_tanh, leaky_relu, relu"
    with pytest.raises(ConfigError, match=rf"activation.*{choices}.*did you mean 'gelu'"):
        MLP(4, activation="gelux")
    with pytest.raises(ConfigError, match="activation"):
        GLU(4, activation=3)
