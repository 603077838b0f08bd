"""xformers' ``MixtureOfExperts`` (its test_moe grid: both gates, local experts, an expert constructor)
against float64 loops written here: top-2 mixes each token's two likeliest experts by their
renormalised router probabilities, round robin sends token i to expert i mod E."""

from __future__ import annotations

import pytest
import torch

from brickwork.errors import ConfigError
from brickwork.xformers.components import Activation
from brickwork.xformers.components.feedforward import FEEDFORWARD_REGISTRY, build_feedforward
from brickwork.xformers.components.feedforward.mixture_of_experts import GateConfig, MixtureOfExperts

DIM, EXPERTS = 16, 4


def linear_expert() -> torch.nn.Module:
    return torch.nn.Linear(DIM, DIM, bias=False)


def build(gate: str, **options: object) -> MixtureOfExperts:
    fixed = {"dim_model": DIM, "dropout": 0.0, "activation": Activation.ReLU, "hidden_layer_multiplier": 2}
    return build_feedforward(
        {"name": "MixtureOfExperts", **fixed, "number_of_experts": EXPERTS, "gate": gate, **options}
    )


def reference(moe: MixtureOfExperts, x: torch.Tensor, gate: str) -> torch.Tensor:
    """The layer's output from its own weights, token by token in float64."""
    layer = moe.moe.double()
    tokens = x.double().reshape(-1, DIM)
    out = torch.zeros_like(tokens)
    for i, token in enumerate(tokens):
        if gate == "round_robin":
            out[i] = layer.experts[i % EXPERTS](token[None])[0]
            continue
        probs = torch.softmax(token @ layer.router.weight.T, dim=-1)
        top = sorted(range(EXPERTS), key=lambda e: -probs[e].item())[:2]
        total = sum(probs[e] for e in top)
        out[i] = sum(probs[e] / total * layer.experts[e](token[None])[0] for e in top)
    return out.reshape(x.shape)


@pytest.mark.parametrize("gate", [g.value for g in GateConfig])
@pytest.mark.parametrize("number_of_local_experts", [None, EXPERTS])
@pytest.mark.parametrize("expert_constructor", [None, linear_expert])
def test_moe_matches_its_gate_mixing_its_experts(gate, number_of_local_experts, expert_constructor) -> None:
    torch.manual_seed(0)
    moe = build(gate, number_of_local_experts=number_of_local_experts, expert_constructor=expert_constructor)
    x = torch.randn(3, 8, DIM, requires_grad=True)
    out = moe(x)
    out.sum().backward()
    assert x.grad is not None and all(p.grad is not None for p in moe.parameters())
    if expert_constructor is not None:
        assert all(isinstance(e, torch.nn.Linear) for e in moe.moe.experts)
    torch.testing.assert_close(out.double(), reference(moe, x.detach(), gate), atol=1e-5, rtol=1e-5)


def test_round_robin_spreads_tokens_evenly_and_has_no_router() -> None:
    moe = build("round_robin")
    moe(torch.randn(2, 6, DIM))
    assert moe.moe.expert_counts.tolist() == [3, 3, 3, 3]
    assert moe.moe.router is None and moe.moe.aux_loss_weight == 0.0
    assert "MixtureOfExperts" in FEEDFORWARD_REGISTRY


@pytest.mark.parametrize(
    ("options", "path"),
    [
        ({"number_of_local_experts": 5}, "number_of_local_experts"),
        ({"gate": "top_3"}, "gate"),
        ({"hidden_layer_multiplier": 0}, "hidden_dim"),  # as xformers' MLP names it: not taken as "unset"
    ],
)
def test_bad_options_are_named(options: dict, path: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{path}: "):
        build(options.pop("gate", "top_2"), **options)
