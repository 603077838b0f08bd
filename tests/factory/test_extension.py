"""Components defined outside brickwork, registered with the public functions, are usable by name."""

from dataclasses import dataclass

import pytest
import torch
from torch import nn

from brickwork.components.attention import ATTENTION_REGISTRY, AttentionMechanism, register_attention
from brickwork.components.feedforward import FEEDFORWARD_REGISTRY, Feedforward, register_feedforward
from brickwork.components.positional import POSITIONAL_REGISTRY, PositionalEncoding, register_positional
from brickwork.components.residual import NORM_REGISTRY, register_norm
from brickwork.errors import ConfigError
from brickwork.factory import build_model


class CosineAttention(AttentionMechanism):
    """Softmax over temperature-scaled cosine similarities."""

    causal_safe = True

    @dataclass
    class Config:
        temperature: float = 10.0
        causal: bool = False

        def __post_init__(self) -> None:
            if self.temperature <= 0:
                raise ConfigError(f"must be > 0, got {self.temperature}", "temperature")

    def __init__(self, temperature: float = 10.0, causal: bool = False) -> None:
        super().__init__()
        self.temperature, self.causal = temperature, causal

    def forward(self, q, k, v, attn_mask=None):
        scores = nn.functional.normalize(q, dim=-1) @ nn.functional.normalize(k, dim=-1).transpose(-2, -1)
        if self.causal:
            tq, tk = scores.shape[-2:]
            keep = torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq)
            scores = scores.masked_fill(~keep, float("-inf"))
        return torch.softmax(scores * self.temperature, dim=-1) @ v


class DoubleGelu(Feedforward):
    """A feedforward without a Config dataclass: its options come from the constructor."""

    def __init__(self, dim_model: int, scale: float = 1.0) -> None:
        super().__init__()
        self.proj = nn.Linear(dim_model, dim_model)
        self.scale = scale

    def forward(self, x):
        return self.scale * nn.functional.gelu(self.proj(x))


class OffsetPositions(PositionalEncoding):
    """Adds one learned vector to every position."""

    position_kind = "additive"

    def __init__(self, dim_model: int) -> None:
        super().__init__()
        self.offset = nn.Parameter(torch.zeros(dim_model))

    def forward(self, x, offset: int = 0):
        return x + self.offset


class ScaleNorm(nn.Module):
    """x * g / ||x|| (Nguyen & Salazar 2019)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.tensor(dim**0.5))
        self.eps = eps

    def forward(self, x):
        return self.gain * x / x.norm(dim=-1, keepdim=True).clamp_min(self.eps)


@pytest.fixture(autouse=True, scope="module")
def _registered_for_this_module():
    """Register through the public functions, and leave the registries as found for other tests."""
    register_attention("test_cosine")(CosineAttention)
    register_feedforward("test_gelu_residual")(DoubleGelu)
    register_positional("test_offset")(OffsetPositions)
    register_norm("test_scale_norm")(ScaleNorm)
    yield
    ATTENTION_REGISTRY.unregister("test_cosine")
    FEEDFORWARD_REGISTRY.unregister("test_gelu_residual")
    POSITIONAL_REGISTRY.unregister("test_offset")
    NORM_REGISTRY.unregister("test_scale_norm")


def user_spec() -> dict:
    return {
        "model": "decoder_lm",
        "vocab_size": 20,
        "dim_model": 8,
        "position": "test_offset",
        "decoder": {
            "num_layers": 2,
            "block": {
                "attention": {"num_heads": 2, "mechanism": {"name": "test_cosine", "temperature": 5}},
                "feedforward": {"name": "test_gelu_residual", "scale": 0.5},
                "norm": {"name": "test_scale_norm", "eps": 1.0e-6},
            },
        },
    }


def test_user_components_build_by_name_and_run() -> None:
    model = build_model(user_spec())
    layer = model.layers[0]
    assert isinstance(layer.attention.mechanism, CosineAttention) and layer.attention.mechanism.causal
    assert layer.attention.mechanism.temperature == 5.0
    assert isinstance(layer.feedforward, DoubleGelu) and layer.feedforward.scale == 0.5
    assert isinstance(layer.attention_norm, ScaleNorm) and layer.attention_norm.eps == 1e-6
    assert isinstance(model.position_embedding, OffsetPositions)
    out = model(torch.randint(0, 20, (2, 5)))
    assert out.shape == (2, 5, 20)
    assert model.spec["decoder"]["block"]["feedforward"] == {"name": "test_gelu_residual", "scale": 0.5}
    assert build_model(model.spec).spec == model.spec


def test_user_component_options_are_checked_like_built_in_ones() -> None:
    spec = user_spec()
    spec["decoder"]["block"]["attention"]["mechanism"]["temperature"] = -1.0
    with pytest.raises(ConfigError, match=r"^decoder\.block\.attention\.mechanism\.temperature: must be > 0"):
        build_model(spec)
    spec = user_spec()
    spec["decoder"]["block"]["feedforward"]["scal"] = 2.0
    with pytest.raises(ConfigError, match=r"^decoder\.block\.feedforward\.scal: .*did you mean 'scale'"):
        build_model(spec)
    spec = user_spec()
    spec["decoder"]["block"]["feedforward"]["scale"] = "big"
    with pytest.raises(ConfigError, match=r"^decoder\.block\.feedforward\.scale: expected float"):
        build_model(spec)
