"""MultiHeadAttention's per-head q/k norm (``qk_norm``) and its ``bias="qkv"``, against a float64 formula."""

import math

import pytest
import torch
from attention_reference import reference_attention

from brickwork.components.attention import KVCache, MultiHeadAttention
from brickwork.components.positional import RotaryEmbedding
from brickwork.components.residual import LayerNorm, RMSNorm
from brickwork.errors import ConfigError
from brickwork.factory import build_model, get_preset

B, T, DIM, HEADS, KV_HEADS, D = 2, 7, 24, 6, 2, 6


@torch.no_grad()
def _randomized(layer: MultiHeadAttention) -> MultiHeadAttention:
    """Every parameter drawn anew: norm gains away from 1, so a norm left out or misplaced shows."""
    g = torch.Generator().manual_seed(0)
    for p in layer.parameters():
        p.copy_(torch.randn(p.shape, generator=g) / (math.sqrt(p.shape[-1]) if p.dim() == 2 else 2))
    return layer


def _rotate(x: torch.Tensor, base: float, offset: int = 0) -> torch.Tensor:
    """Half-split rotary on [B, H, T, D], in float64."""
    half = x.shape[-1] // 2
    freq = base ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    angle = (torch.arange(x.shape[-2], dtype=torch.float64) + offset)[:, None] * freq
    a, b = x[..., :half], x[..., half : 2 * half]
    return torch.cat(
        [a * angle.cos() - b * angle.sin(), b * angle.cos() + a * angle.sin(), x[..., 2 * half :]], -1
    )


def _formula(layer: MultiHeadAttention, x: torch.Tensor, base: float) -> torch.Tensor:
    """Project, RMS-normalise each head's D channels (x / sqrt(mean(x²) + eps) * gain), rotate, attend
    causally, project out: every step in float64 from the layer's own weights."""
    x = x.double()

    def heads(proj: torch.nn.Linear, norm: RMSNorm | None) -> torch.Tensor:
        w, bias = proj.weight.double(), proj.bias
        y = (x @ w.T + (0 if bias is None else bias.double())).view(B, x.shape[1], -1, D)
        if norm is not None:
            y = y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight.double()
        return y.transpose(1, 2)

    q = _rotate(heads(layer.q_proj, layer.q_norm), base)
    k = _rotate(heads(layer.k_proj, layer.k_norm), base)
    out = reference_attention(q, k, heads(layer.v_proj, None), causal=True)
    out = out.transpose(1, 2).reshape(B, x.shape[1], -1) @ layer.out_proj.weight.double().T
    return out if layer.out_proj.bias is None else out + layer.out_proj.bias.double()


def _layer(**options) -> MultiHeadAttention:
    rotary = RotaryEmbedding(dim_head=D, base=100.0)
    return _randomized(
        MultiHeadAttention(
            DIM, HEADS, causal=True, num_kv_heads=KV_HEADS, dim_head=D, rotary=rotary, **options
        )
    )


@pytest.mark.parametrize("bias", [True, False, "qkv"])
def test_qk_norm_and_biases_match_the_formula(bias) -> None:
    layer = _layer(qk_norm="rmsnorm", bias=bias)
    assert (layer.q_proj.bias is not None) == (bias is not False)
    assert (layer.out_proj.bias is not None) == (bias is True)
    assert isinstance(layer.q_norm, RMSNorm) and layer.q_norm.dim == D and layer.k_norm is not layer.q_norm
    x = torch.randn(B, T, DIM, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(layer(x).double(), _formula(layer, x, 100.0), rtol=1e-5, atol=1e-5)


def test_the_fused_layout_and_the_cache_agree_with_separate_projections() -> None:
    layer = _layer(qk_norm="rmsnorm")
    fused = MultiHeadAttention(DIM, HEADS, causal=True, num_kv_heads=KV_HEADS, dim_head=D, fused_qkv=True,
                               rotary=layer.rotary, qk_norm="rmsnorm")  # fmt: skip
    with torch.no_grad():
        weights = [layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight]
        fused.qkv_proj.weight.copy_(fused.qkv_layout().fuse(*weights))
        fused.qkv_proj.bias.copy_(
            fused.qkv_layout().fuse(layer.q_proj.bias, layer.k_proj.bias, layer.v_proj.bias)
        )
        for name in ("q_norm", "k_norm", "out_proj"):
            fused.get_submodule(name).load_state_dict(layer.get_submodule(name).state_dict())
    x = torch.randn(B, T, DIM, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = layer(x)
        torch.testing.assert_close(fused(x), full, rtol=1e-5, atol=1e-6)
        cache = KVCache()
        steps = [fused(x[:, :3], cache=cache)] + [fused(x[:, i : i + 1], cache=cache) for i in range(3, T)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-6)


def test_a_norm_class_or_partial_and_the_tensor_parallel_plan() -> None:
    layer = MultiHeadAttention(DIM, HEADS, qk_norm=LayerNorm)
    assert isinstance(layer.k_norm, LayerNorm) and layer.k_norm.dim == DIM // HEADS
    assert layer.tp_plan() == {"q_proj": "colwise", "k_proj": "colwise", "v_proj": "colwise",
                               "q_norm": "per_head", "k_norm": "per_head", "out_proj": "rowwise"}  # fmt: skip
    assert MultiHeadAttention(DIM, HEADS).q_norm is None
    with pytest.raises(ConfigError, match="qk_norm has no meaning"):
        MultiHeadAttention(DIM, HEADS, attention="fourier_mix", qk_norm="rmsnorm")
    with pytest.raises(ConfigError, match="bias"):
        MultiHeadAttention(DIM, HEADS, bias="kv")


def test_the_spec_key_is_a_norm_choice_written_back_only_when_set() -> None:
    spec = get_preset("gpt-tiny")
    spec = {**spec, "decoder": {**spec["decoder"], "block": {**spec["decoder"]["block"]}}}
    block = spec["decoder"]["block"]
    block["attention"] = {**block["attention"], "qk_norm": {"name": "rmsnorm", "eps": 1e-5}, "bias": "qkv"}
    model = build_model(spec)
    written = model.spec["decoder"]["block"]["attention"]
    assert (
        written["qk_norm"] == {"name": "rmsnorm", "eps": 1e-5, "backend": None} and written["bias"] == "qkv"
    )
    assert model.layers[0].attention.q_norm.eps == 1e-5 and model.layers[0].attention.out_proj.bias is None
    assert build_model(model.spec).spec == model.spec
    assert "qk_norm" not in build_model(get_preset("gpt-tiny")).spec["decoder"]["block"]["attention"]
    block["attention"]["qk_norm"] = {"name": "rmsnorm", "epz": 1e-5}
    with pytest.raises(ConfigError, match=r"decoder\.block\.attention\.qk_norm\.epz.*did you mean 'eps'"):
        build_model(spec)
