"""Every registered feedforward: shape, gradients, options, config round trip, TP declarations."""

from __future__ import annotations

import pytest
import torch

from brickwork.components.feedforward import FEEDFORWARD_REGISTRY, Feedforward
from brickwork.errors import ConfigError

DIM = 8
SMALL_OPTIONS = {"moe": {"num_experts": 3, "top_k": 2, "hidden_dim": 12}}


def build(name: str) -> Feedforward:
    return FEEDFORWARD_REGISTRY.get(name)(dim_model=DIM, **SMALL_OPTIONS.get(name, {}))


@pytest.mark.parametrize("name", FEEDFORWARD_REGISTRY.keys())
def test_shape_and_gradients_reach_every_parameter(name: str) -> None:
    torch.manual_seed(0)
    ff = build(name)
    x = torch.randn(2, 16, DIM, requires_grad=True)
    y = ff(x)
    assert y.shape == x.shape
    loss = y.square().sum() + (ff.aux_loss if name == "moe" else 0.0)
    loss.backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for pname, p in ff.named_parameters():
        assert p.grad is not None, pname
        assert p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("name", FEEDFORWARD_REGISTRY.keys())
def test_from_config_matches_direct_build(name: str) -> None:
    cls = FEEDFORWARD_REGISTRY.get(name)
    options = {"dim_model": DIM, **SMALL_OPTIONS.get(name, {})}
    torch.manual_seed(1)
    direct = cls(**options)
    torch.manual_seed(1)
    built = cls.from_config(cls.Config(**options))
    assert type(built) is cls
    for (n1, p1), (n2, p2) in zip(direct.named_parameters(), built.named_parameters(), strict=True):
        assert n1 == n2
        torch.testing.assert_close(p1, p2)


@pytest.mark.parametrize("name", FEEDFORWARD_REGISTRY.keys())
@pytest.mark.parametrize(
    ("option", "value"), [("dim_model", 0), ("hidden_dim", -4), ("dropout", 1.0), ("bias", "yes")]
)
def test_bad_option_names_the_option(name: str, option: str, value: object) -> None:
    options = {"dim_model": DIM, **SMALL_OPTIONS.get(name, {}), option: value}
    cls = FEEDFORWARD_REGISTRY.get(name)
    with pytest.raises(ConfigError, match=option):
        cls(**options)
    with pytest.raises(ConfigError, match=option):
        cls.Config(**options)


@pytest.mark.parametrize("name", FEEDFORWARD_REGISTRY.keys())
def test_wrong_input_width_raises_value_error(name: str) -> None:
    with pytest.raises(ValueError, match=r"dim_model=8.*\(2, 3, 5\)"):
        build(name)(torch.randn(2, 3, 5))


def test_tp_plans_declare_colwise_up_and_rowwise_down() -> None:
    assert build("mlp").tp_plan() == {"up_proj": "colwise", "down_proj": "rowwise"}
    for name in ("glu", "swiglu", "geglu"):
        assert build(name).tp_plan() == {"gate_proj": "colwise", "up_proj": "colwise", "down_proj": "rowwise"}
    assert build("moe").tp_plan() == {}


@pytest.mark.parametrize("name", FEEDFORWARD_REGISTRY.keys())
def test_tp_plan_names_existing_linear_children(name: str) -> None:
    ff = build(name)
    for child in ff.tp_plan():
        assert isinstance(ff.get_submodule(child), torch.nn.Linear)
