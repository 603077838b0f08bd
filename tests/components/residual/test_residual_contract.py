"""Every registered residual style against its composition written out here; shapes and gradients."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from brickwork.components.residual import RESIDUAL_REGISTRY, LayerNorm, ResidualStyle
from brickwork.errors import ConfigError

OPTIONS = {"pre": {}, "post": {}, "parallel": {}, "deepnorm": {"alpha": 1.7}}


def expected(name: str, x: torch.Tensor, branches: list) -> torch.Tensor:
    if name == "parallel":
        return x + sum(fn(norm(x)) for norm, fn in branches)
    for norm, fn in branches:
        if name == "pre":
            x = x + fn(norm(x))
        elif name == "post":
            x = norm(x + fn(x))
        else:
            x = norm(1.7 * x + fn(x))
    return x


def make_branches() -> list[tuple[nn.Module, nn.Module]]:
    return [
        (LayerNorm(6).double(), nn.Linear(6, 6).double()),
        (LayerNorm(6).double(), nn.Linear(6, 6).double()),
    ]


def test_every_registered_name_has_options_here() -> None:
    assert sorted(OPTIONS) == RESIDUAL_REGISTRY.keys()


@pytest.mark.parametrize("name", RESIDUAL_REGISTRY.keys())
def test_matches_composition_and_gradients_reach_every_branch(name: str) -> None:
    torch.manual_seed(0)
    style = RESIDUAL_REGISTRY.get(name)(**OPTIONS[name])
    assert isinstance(style, ResidualStyle) and list(style.parameters()) == []
    branches = make_branches()
    for norm, _ in branches:  # non-trivial norm parameters, so a swapped order would show
        nn.init.normal_(norm.weight)
        nn.init.normal_(norm.bias)
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    y = style(x, branches)
    assert y.shape == x.shape
    torch.testing.assert_close(y, expected(name, x, branches))
    y.square().sum().backward()
    for norm, fn in branches:
        for p in [*norm.parameters(), *fn.parameters()]:
            assert p.grad is not None and p.grad.abs().sum() > 0


@pytest.mark.parametrize("name", RESIDUAL_REGISTRY.keys())
def test_a_missing_norm_is_the_identity(name: str) -> None:
    style = RESIDUAL_REGISTRY.get(name)(**OPTIONS[name])
    x = torch.randn(2, 3, 6, dtype=torch.float64)
    fn = nn.Linear(6, 6).double()
    alpha = 1.7 if name == "deepnorm" else 1.0
    torch.testing.assert_close(style(x, [(None, fn)]), alpha * x + fn(x))


@pytest.mark.parametrize("name", RESIDUAL_REGISTRY.keys())
def test_from_config(name: str) -> None:
    cls = RESIDUAL_REGISTRY.get(name)
    assert type(cls.from_config(cls.Config(**OPTIONS[name]))) is cls


def test_parallel_branches_all_read_the_same_input() -> None:
    seen: list[torch.Tensor] = []

    def record(h: torch.Tensor) -> torch.Tensor:
        seen.append(h)
        return torch.ones_like(h)

    x = torch.zeros(1, 2, 4)
    out = RESIDUAL_REGISTRY.get("parallel")()(x, [(None, record), (None, record)])
    assert seen[0] is x and seen[1] is x
    torch.testing.assert_close(out, torch.full_like(x, 2.0))


def test_unknown_style_lists_choices() -> None:
    with pytest.raises(ConfigError, match=r"allowed: deepnorm, parallel, post, pre.*did you mean 'parallel'"):
        RESIDUAL_REGISTRY.get("paralel")
