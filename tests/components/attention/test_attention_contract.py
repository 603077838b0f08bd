"""The contract every registered attention mechanism keeps, checked through MultiHeadAttention."""

import pickle

import pytest
import torch

from brickwork.components.attention import ATTENTION_REGISTRY, AttentionMechanism, MultiHeadAttention
from brickwork.errors import ConfigError

B, T, DIM, HEADS = 2, 9, 16, 2  # T = 3 x 3: the grid mixers (visual) need a square
# Options a few mechanisms need at this tiny size; any other registered mechanism runs on its defaults.
OPTIONS = {
    "linformer": {"seq_len": T},
    "nystrom": {"num_landmarks": 3},
    "favor": {"seed": 0},
    "ortho": {"num_landmarks": 3},
    "lambda_layer": {"seq_len": T},
    "blocksparse": {"block_size": 4},
    "random": {"r": 0.3},
}
NAMES = ATTENTION_REGISTRY.names()


def _layer(name: str, causal: bool = False) -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(DIM, HEADS, attention=name, causal=causal, attention_options=OPTIONS.get(name))


def _padding() -> torch.Tensor:
    keep = torch.ones(B, T, dtype=torch.bool)
    keep[0, -3:] = False
    keep[1, 4] = False
    return keep


def test_registry_holds_the_builtin_mechanisms() -> None:
    expected = {
        "scaled_dot_product", "local", "linformer", "nystrom", "favor", "fourier_mix", "pooling", "ortho",
        "lambda_layer", "random", "global", "blocksparse", "compositional", "visual",
    }  # fmt: skip
    assert expected <= set(NAMES)
    for name in NAMES:
        cls = ATTENTION_REGISTRY.get(name)
        assert issubclass(cls, AttentionMechanism)
        assert cls.mask_support in ("full", "key_padding", "none")
        assert set(cls.needs) <= {"num_heads", "dim_head"}


@pytest.mark.parametrize("name", NAMES)
def test_shape_and_gradients_reach_every_parameter(name: str) -> None:
    layer = _layer(name)
    x = torch.randn(B, T, DIM, requires_grad=True)
    out = layer(x)
    assert out.shape == (B, T, DIM)
    assert torch.isfinite(out).all()
    (out * torch.randn_like(out)).sum().backward()
    for pname, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient reaches {pname}"
    assert x.grad.abs().sum() > 0


@pytest.mark.parametrize("name", NAMES)
def test_mechanism_alone_keeps_shape(name: str) -> None:
    mechanism = _layer(name).mechanism
    q, k, v = (torch.randn(B, HEADS, T, DIM // HEADS) for _ in range(3))
    assert mechanism(q, k, v).shape == (B, HEADS, T, DIM // HEADS)


@pytest.mark.parametrize("name", NAMES)
def test_causal_never_looks_ahead(name: str) -> None:
    if not ATTENTION_REGISTRY.get(name).causal_safe:
        with pytest.raises(ConfigError, match="causal"):
            _layer(name, causal=True)
        return
    layer = _layer(name, causal=True)
    assert layer.causal
    x = torch.randn(B, T, DIM)
    for cut in (1, 4, T - 1):
        changed = x.clone()
        changed[:, cut:] = torch.randn(B, T - cut, DIM)
        before, after = layer(x), layer(changed)
        torch.testing.assert_close(after[:, :cut], before[:, :cut], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(after[:, cut:], before[:, cut:], atol=1e-3)


@pytest.mark.parametrize("name", NAMES)
def test_padding_mask_really_masks(name: str) -> None:
    layer = _layer(name)
    keep = _padding()
    mask = keep[:, None, None, :]
    x = torch.randn(B, T, DIM)
    if layer.mechanism.mask_support == "none":
        with pytest.raises(ValueError, match="attn_mask"):
            layer(x, attn_mask=mask)
        return
    changed = x.clone()
    changed[~keep] = 10 * torch.randn(int((~keep).sum()), DIM)
    torch.testing.assert_close(layer(changed, attn_mask=mask)[keep], layer(x, attn_mask=mask)[keep])
    # Without the mask the same change does reach the real tokens, so the check above means something.
    assert not torch.allclose(layer(changed)[keep], layer(x)[keep], atol=1e-3)


@pytest.mark.parametrize("name", NAMES)
def test_masks_beyond_support_raise(name: str) -> None:
    layer = _layer(name)
    x = torch.randn(B, T, DIM)
    per_query = torch.ones(T, T, dtype=torch.bool).tril()
    if layer.mechanism.mask_support == "full":
        layer(x, attn_mask=per_query)
        return
    with pytest.raises(ValueError, match="mask"):
        layer(x, attn_mask=per_query)


@pytest.mark.parametrize("name", NAMES)
def test_config_round_trip(name: str) -> None:
    cls = ATTENTION_REGISTRY.get(name)
    built = _layer(name).mechanism
    rebuilt = cls.from_config(built.config)
    assert type(rebuilt) is cls and rebuilt.config == built.config
    assert pickle.loads(pickle.dumps(built.config)) == built.config  # found again as cls.Config


CAUSAL = [name for name in NAMES if ATTENTION_REGISTRY.get(name).causal_safe]


@pytest.mark.parametrize("name", CAUSAL)
def test_causal_never_looks_ahead_in_bf16(name: str) -> None:
    # Not even by rounding: the earlier outputs are bit-for-bit the same.
    layer = _layer(name, causal=True).to(torch.bfloat16)
    x = torch.randn(B, T, DIM, dtype=torch.bfloat16)
    changed = x.clone()
    changed[:, 6:] = torch.randn(B, T - 6, DIM, dtype=torch.bfloat16)
    before, after = layer(x), layer(changed)
    assert torch.equal(after[:, :6], before[:, :6])
    assert not torch.equal(after[:, 6:], before[:, 6:])


@pytest.mark.parametrize("name", [n for n in NAMES if ATTENTION_REGISTRY.get(n).supports_gqa])
def test_grouped_kv_heads_equal_repeated_kv_heads(name: str) -> None:
    mechanism = _layer(name).mechanism.eval()
    q = torch.randn(B, 4, T, 8)
    k, v = torch.randn(B, 2, T, 8), torch.randn(B, 2, T, 8)
    repeated = mechanism(q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1))
    torch.testing.assert_close(mechanism(q, k, v), repeated, atol=1e-5, rtol=1e-5)
