"""Mixture of experts against routing, mixing and load-balancing formulas computed here."""

from __future__ import annotations

import pytest
import torch

from brickwork.components.feedforward import MLP, MixtureOfExperts, SwiGLU
from brickwork.errors import ConfigError


def reference(moe: MixtureOfExperts, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token loop: softmax router, top-k, weighted sum of chosen experts; and the aux loss."""
    tokens = x.reshape(-1, x.shape[-1])
    probs = torch.softmax(tokens @ moe.router.weight.T, dim=-1)
    out = torch.zeros_like(tokens)
    counts = torch.zeros(moe.num_experts, dtype=torch.float64)
    for n in range(tokens.shape[0]):
        order = sorted(range(moe.num_experts), key=lambda e: -probs[n, e].item())[: moe.top_k]
        total = sum(probs[n, e] for e in order) if moe.normalize_top_k else 1.0
        for e in order:
            out[n] += probs[n, e] / total * moe.experts[e](tokens[n])
            counts[e] += 1
    fraction = counts / (tokens.shape[0] * moe.top_k)
    aux = moe.num_experts * (fraction * probs.mean(dim=0)).sum()
    return out.reshape(x.shape), aux


@pytest.mark.parametrize(("top_k", "normalize"), [(1, False), (2, True), (2, False), (3, True)])
def test_output_and_aux_loss_match_reference(top_k: int, normalize: bool) -> None:
    torch.manual_seed(0)
    moe = MixtureOfExperts(6, num_experts=4, top_k=top_k, hidden_dim=8, normalize_top_k=normalize).double()
    x = torch.randn(2, 7, 6, dtype=torch.float64)
    out = moe(x)
    expected, aux = reference(moe, x)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(moe.aux_loss, aux)


def test_route_picks_the_top_k_probabilities() -> None:
    torch.manual_seed(0)
    moe = MixtureOfExperts(6, num_experts=5, top_k=2, hidden_dim=8)
    tokens = torch.randn(11, 6)
    probs, weights, chosen = moe.route(tokens)
    expected_probs = torch.softmax(tokens @ moe.router.weight.T, dim=-1)
    torch.testing.assert_close(probs, expected_probs)
    for n in range(11):
        assert set(chosen[n].tolist()) == set(expected_probs[n].argsort(descending=True)[:2].tolist())
    torch.testing.assert_close(weights.sum(-1), torch.ones(11))


def test_aux_loss_is_one_when_routing_is_uniform() -> None:
    moe = MixtureOfExperts(4, num_experts=4, top_k=1, hidden_dim=4)
    with torch.no_grad():
        moe.router.weight.copy_(torch.eye(4) * 10)
    x = torch.eye(4).repeat(3, 1)  # each expert wins three tokens
    moe(x)
    # f_i = 1/4 for each expert, P_i averaged = 1/4 as well by symmetry.
    torch.testing.assert_close(moe.aux_loss, torch.tensor(1.0))


def test_gradients_reach_the_router_through_output_and_aux_loss() -> None:
    torch.manual_seed(0)
    moe = MixtureOfExperts(6, num_experts=4, top_k=2, hidden_dim=8)
    moe(torch.randn(3, 5, 6)).sum().backward()
    assert moe.router.weight.grad is not None and moe.router.weight.grad.abs().sum() > 0
    moe.zero_grad()
    moe(torch.randn(3, 5, 6))
    moe.aux_loss.backward()
    assert moe.router.weight.grad.abs().sum() > 0


def test_expert_kind_and_activation_are_passed_to_each_expert() -> None:
    moe = MixtureOfExperts(6, num_experts=3, top_k=1, hidden_dim=8, expert="swiglu", bias=False)
    assert all(isinstance(e, SwiGLU) for e in moe.experts)
    moe = MixtureOfExperts(6, num_experts=2, top_k=1, hidden_dim=8, activation="relu")
    assert all(isinstance(e, MLP) and isinstance(e.activation, torch.nn.ReLU) for e in moe.experts)


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"num_experts": 0}, "num_experts"),
        ({"top_k": 5, "num_experts": 4}, "top_k"),
        ({"top_k": 0}, "top_k"),
        ({"expert": "moe"}, "expert"),
        ({"expert": "swiglu", "activation": "relu"}, "activation"),
        ({"activation": "tanhh"}, "activation"),
        ({"normalize_top_k": 1}, "normalize_top_k"),
    ],
)
def test_bad_options(options: dict, option: str) -> None:
    with pytest.raises(ConfigError, match=option):
        MixtureOfExperts(6, **options)


def test_experts_bank_applies_each_expert_to_its_rows_and_keeps_single_process_names() -> None:
    torch.manual_seed(0)
    moe = MixtureOfExperts(6, num_experts=4, top_k=1, hidden_dim=8)
    bank = moe.experts
    rows, counts = torch.randn(5, 6), torch.tensor([2, 0, 3, 0])  # experts 1 and 3 get no row
    expected = torch.cat([bank[0](rows[:2]), bank[2](rows[2:])])
    torch.testing.assert_close(bank(rows, counts), expected)
    names = list(moe.state_dict())
    bank.keep([2, 3])
    assert bank.indices() == [2, 3] and len(bank) == 2
    assert list(moe.state_dict()) == [n for n in names if not n.startswith(("experts.0.", "experts.1."))]
    torch.testing.assert_close(bank(rows[2:], torch.tensor([3, 0])), expected[2:])
    with pytest.raises(ValueError, match="counts has 4 entries for 2 experts"):
        bank(rows, counts)


def test_an_expert_no_token_chose_still_gets_a_zero_gradient() -> None:
    torch.manual_seed(0)
    moe = MixtureOfExperts(6, num_experts=3, top_k=1, hidden_dim=8)
    with torch.no_grad():
        moe.router.weight[2] = (moe.router.weight[0] + moe.router.weight[1]) / 2  # never the largest
    moe(torch.randn(4, 5, 6)).sum().backward()
    assert moe.expert_counts[2] == 0
    grads = [p.grad for p in moe.experts[2].parameters()]
    assert all(g is not None and not g.any() for g in grads)
    assert any(p.grad.any() for p in moe.experts[0].parameters())
