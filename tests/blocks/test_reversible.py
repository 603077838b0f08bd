"""Reversible stacks: the same numbers as the coupling run with stored activations, flat memory."""

import copy

import pytest
import torch

from brickwork.blocks import Block
from brickwork.blocks.reversible import ReversibleLayers
from brickwork.components.attention import MultiHeadAttention
from brickwork.components.feedforward import MLP
from brickwork.factory import ConfigError, build_model


def _blocks(depth: int, dropout: float = 0.0) -> list[Block]:
    return [
        Block(MultiHeadAttention(16, 2, causal=True, dropout=dropout), MLP(16, 32, dropout=dropout))
        for _ in range(depth)
    ]


def _coupling(layers: ReversibleLayers, h: torch.Tensor) -> torch.Tensor:
    """The RevNet coupling written out, every activation kept by autograd."""
    x1 = x2 = h
    for b in layers:
        x1 = x1 + b.attention(b.attention_norm(x2))
        x2 = x2 + b.feedforward(b.feedforward_norm(x1))
    return (x1 + x2) / 2


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_recomputed_backward_matches_the_stored_one(dropout: float) -> None:
    torch.manual_seed(0)
    layers = ReversibleLayers(_blocks(3, dropout))
    plain = copy.deepcopy(layers)
    h = torch.randn(2, 7, 16, requires_grad=True)
    h_plain = h.detach().clone().requires_grad_()
    weights = torch.randn(2, 7, 16)
    torch.manual_seed(5)  # the same dropout draws on both sides
    out = layers(h)
    (out * weights).sum().backward()
    torch.manual_seed(5)
    expected = _coupling(plain, h_plain)
    (expected * weights).sum().backward()
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(h.grad, h_plain.grad, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(layers.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5, msg=name)


def _saved_bytes(layers: ReversibleLayers | torch.nn.Module, h: torch.Tensor) -> int:
    """Bytes autograd keeps for the backward pass (each storage counted once)."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layers(h)
    return sum(storages.values())


def test_activation_memory_does_not_grow_with_depth() -> None:
    h = torch.randn(2, 32, 16, requires_grad=True)
    reversible = [_saved_bytes(ReversibleLayers(_blocks(d)), h) for d in (2, 8)]
    plain = []
    for depth in (2, 8):
        layers = ReversibleLayers(_blocks(depth))
        plain.append(_saved_bytes(lambda x, layers=layers: _coupling(layers, x), h))
    assert reversible[0] == reversible[1]
    assert plain[1] > 3 * plain[0] and reversible[1] < plain[0]


def _spec(**stack) -> dict:
    return {
        "model": "decoder_lm", "vocab_size": 30, "dim_model": 16, "max_seq_len": 12,
        "decoder": {"num_layers": 3, "block": {"attention": {"num_heads": 2}}, **stack},
    }  # fmt: skip


def test_the_spec_key_builds_a_reversible_stack_that_decodes_with_a_cache() -> None:
    torch.manual_seed(0)
    model = build_model(_spec(reversible=True))
    assert isinstance(model.layers, ReversibleLayers) and model.spec["decoder"]["reversible"] is True
    ids = torch.randint(0, 30, (2, 8))
    logits = model(ids)
    logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    with torch.no_grad():
        torch.testing.assert_close(model(ids), logits)
        cache = model.new_cache()
        steps = [model(ids[:, :5], cache=cache)] + [
            model(ids[:, i : i + 1], cache=cache) for i in range(5, 8)
        ]
    torch.testing.assert_close(torch.cat(steps, dim=1), logits, atol=1e-5, rtol=1e-5)


def test_reversible_needs_pre_norm_self_attention_blocks() -> None:
    with pytest.raises(ConfigError, match=r"^decoder\.reversible: .*pre-norm") as info:
        build_model(_spec(reversible=True, layers={1: {"residual": "post"}}))
    assert "block 1 is not one" in str(info.value)
    with pytest.raises(ConfigError, match=r"^blocks: .*block 0 is not one"):
        ReversibleLayers(
            [Block(MultiHeadAttention(16, 2), MLP(16), cross_attention=MultiHeadAttention(16, 2))]
        )
    with pytest.raises(ConfigError, match="block 1 is not one"):  # its coupling would drop the post-norm
        ReversibleLayers(
            [
                Block(MultiHeadAttention(16, 2), MLP(16)),
                Block(MultiHeadAttention(16, 2), MLP(16), residual="post"),
            ]
        )


def test_the_memory_benchmark_shows_flat_activations() -> None:
    from brickwork.benchmarks.reversible_memory import run

    rows = {(r["depth"], r["reversible"]): r for r in run([2, 4], dim=32, seq_len=32, batch=2)}
    assert rows[2, True]["saved_mib"] == rows[4, True]["saved_mib"]
    assert rows[4, False]["saved_mib"] > 1.5 * rows[2, False]["saved_mib"]
    assert rows[4, True]["peak_mib"] < rows[4, False]["peak_mib"]
