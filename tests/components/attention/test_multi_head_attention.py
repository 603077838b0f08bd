"""MultiHeadAttention: against torch's module, KV-cache decoding, fused layout, hooks, head sharding."""

import copy
import functools

import pytest
import torch
from attention_reference import reference_attention
from torch import nn

from brickwork.components.attention import KVCache, MultiHeadAttention, ScaledDotProduct
from brickwork.components.positional import ALiBi, RotaryEmbedding

B, T, DIM, HEADS = 2, 7, 16, 4


class Rotation:
    """A minimal rotary embedding: channel pairs turn by position x frequency. Records each call."""

    def __init__(self, dim_head: int) -> None:
        self.freq = 10000.0 ** (-torch.arange(0, dim_head, 2) / dim_head)
        self.calls: list[tuple[tuple, tuple, int]] = []

    def _turn(self, x: torch.Tensor, offset: int) -> torch.Tensor:
        angle = (torch.arange(x.shape[-2]) + offset)[:, None] * self.freq
        even, odd = x[..., 0::2], x[..., 1::2]
        turned = torch.stack(
            [even * angle.cos() - odd * angle.sin(), even * angle.sin() + odd * angle.cos()], -1
        )
        return turned.flatten(-2)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, offset: int = 0):
        self.calls.append((tuple(q.shape), tuple(k.shape), offset))
        return self._turn(q, offset), self._turn(k, offset)


class DistanceBias:
    """ALiBi-style bias -slope_h * (i - j), bottom-right aligned."""

    def __init__(self, num_heads: int) -> None:
        self.slopes = 2.0 ** -torch.arange(1, num_heads + 1, dtype=torch.float32)

    def __call__(self, tq: int, tk: int, device=None) -> torch.Tensor:
        distance = (torch.arange(tq) + tk - tq)[:, None] - torch.arange(tk)[None, :]
        return -self.slopes[:, None, None] * distance.abs()


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer


def _fuse(separate: MultiHeadAttention) -> MultiHeadAttention:
    """The same layer with one qkv_proj, rows laid out per kv group (its q heads, then k, then v)."""
    h, hkv, d = separate.num_heads, separate.num_kv_heads, separate.dim_head
    fused = MultiHeadAttention(DIM, h, causal=separate.causal, num_kv_heads=hkv, fused_qkv=True)

    def grouped(name: str) -> torch.Tensor:
        q = getattr(separate.q_proj, name).reshape(hkv, h // hkv * d, -1)
        k = getattr(separate.k_proj, name).reshape(hkv, d, -1)
        v = getattr(separate.v_proj, name).reshape(hkv, d, -1)
        return (
            torch.cat([q, k, v], dim=1).reshape(-1, DIM)
            if name == "weight"
            else torch.cat([q, k, v], 1).flatten()
        )

    fused.qkv_proj = _linear(grouped("weight"), grouped("bias"))
    fused.out_proj = copy.deepcopy(separate.out_proj)
    return fused


def _torch_twin(layer: MultiHeadAttention) -> nn.MultiheadAttention:
    twin = nn.MultiheadAttention(DIM, HEADS, batch_first=True)
    with torch.no_grad():
        twin.in_proj_weight.copy_(torch.cat([layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight]))
        twin.in_proj_bias.copy_(torch.cat([layer.q_proj.bias, layer.k_proj.bias, layer.v_proj.bias]))
        twin.out_proj.weight.copy_(layer.out_proj.weight)
        twin.out_proj.bias.copy_(layer.out_proj.bias)
    return twin.eval()


def test_self_attention_matches_torch_module() -> None:
    torch.manual_seed(0)
    layer = MultiHeadAttention(DIM, HEADS, causal=True)
    x = torch.randn(B, T, DIM)
    keep = torch.ones(B, T, dtype=torch.bool)
    keep[0, 5:] = False
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    expected, _ = _torch_twin(layer)(x, x, x, key_padding_mask=~keep, attn_mask=future, need_weights=False)
    torch.testing.assert_close(layer(x, attn_mask=keep[:, None, None, :]), expected, atol=1e-5, rtol=1e-5)


def test_cross_attention_matches_torch_module_and_caches_memory() -> None:
    torch.manual_seed(0)
    layer = MultiHeadAttention(DIM, HEADS)
    x, memory = torch.randn(B, T, DIM), torch.randn(B, 9, DIM)
    keep = torch.ones(B, 9, dtype=torch.bool)
    keep[1, 6:] = False
    mask = keep[:, None, None, :]
    expected, _ = _torch_twin(layer)(x, memory, memory, key_padding_mask=~keep, need_weights=False)
    torch.testing.assert_close(layer(x, memory=memory, attn_mask=mask), expected, atol=1e-5, rtol=1e-5)
    cache = KVCache()
    steps = [layer(x[:, i : i + 1], memory=memory, attn_mask=mask, cache=cache) for i in range(T)]
    assert cache.length == 9
    torch.testing.assert_close(torch.cat(steps, dim=1), expected, atol=1e-5, rtol=1e-5)


MECHANISMS = {
    "sdpa": ("scaled_dot_product", {}),
    "math": ("scaled_dot_product", {"backend": "math"}),
    "local": ("local", {"window_size": 5}),
    "favor": ("favor", {"seed": 0}),
}


# favor takes key-padding masks only, so it is not combined with an additive bias.
DECODE_CASES = [
    (m, hook) for m in MECHANISMS for hook in (None, "rotary", "alibi") if (m, hook) != ("favor", "alibi")
]


@pytest.mark.parametrize("mechanism,hook", DECODE_CASES)
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("num_kv_heads", [None, 2, 1])
def test_kv_cache_decode_equals_full_forward(
    mechanism: str, hook, fused: bool, num_kv_heads: int | None
) -> None:
    name, options = MECHANISMS[mechanism]
    torch.manual_seed(0)
    layer = MultiHeadAttention(
        DIM,
        HEADS,
        attention=name,
        causal=True,
        num_kv_heads=num_kv_heads,
        fused_qkv=fused,
        rotary=Rotation(DIM // HEADS) if hook == "rotary" else None,
        position_bias=DistanceBias(HEADS) if hook == "alibi" else None,
        attention_options=options,
    )
    x = torch.randn(B, T, DIM)
    full = layer(x)
    cache = KVCache()
    chunks = [layer(x[:, a:b], cache=cache) for a, b in ((0, 3), (3, 4), (4, 5), (5, 7))]
    assert cache.length == T
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fused", [False, True])
def test_kv_cache_decode_with_brickwork_rotary_and_alibi(fused: bool) -> None:
    torch.manual_seed(0)
    x = torch.randn(B, T, DIM)
    for hooks in ({"rotary": RotaryEmbedding(DIM // HEADS)}, {"position_bias": ALiBi(HEADS)}):
        layer = MultiHeadAttention(DIM, HEADS, causal=True, num_kv_heads=2, fused_qkv=fused, **hooks)
        cache = KVCache()
        steps = torch.cat(
            [layer(x[:, :4], cache=cache)] + [layer(x[:, i : i + 1], cache=cache) for i in range(4, T)], 1
        )
        torch.testing.assert_close(steps, layer(x), atol=1e-5, rtol=1e-5)


def test_rotary_hook_gets_head_shapes_and_cache_offset() -> None:
    rotary = Rotation(4)
    layer = MultiHeadAttention(DIM, HEADS, causal=True, num_kv_heads=2, rotary=rotary)
    cache = KVCache()
    layer(torch.randn(B, 3, DIM), cache=cache)
    layer(torch.randn(B, 1, DIM), cache=cache)
    assert rotary.calls == [((B, 4, 3, 4), (B, 2, 3, 4), 0), ((B, 4, 1, 4), (B, 2, 1, 4), 3)]


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_fused_projection_matches_separate(num_kv_heads: int) -> None:
    torch.manual_seed(0)
    separate = MultiHeadAttention(DIM, HEADS, causal=True, num_kv_heads=num_kv_heads)
    fused = _fuse(separate)
    x = torch.randn(B, T, DIM, requires_grad=True)
    out = fused(x)
    torch.testing.assert_close(out, separate(x), atol=1e-6, rtol=1e-6)
    # One kv head per query head takes q, k and v apart by an unbind, grouped heads by a split: the
    # gradient flows back through either.
    (grad,) = torch.autograd.grad(out.square().sum(), x)
    (expected,) = torch.autograd.grad(separate(x).square().sum(), x)
    torch.testing.assert_close(grad, expected, atol=1e-5, rtol=1e-5)


def test_position_bias_is_added_to_the_scores() -> None:
    torch.manual_seed(0)
    bias = DistanceBias(HEADS)
    layer = MultiHeadAttention(DIM, HEADS, position_bias=bias)
    x = torch.randn(B, T, DIM)
    keep = torch.ones(B, 1, 1, T, dtype=torch.bool)
    keep[1, ..., :2] = False
    q, k, v = (p(x).view(B, T, HEADS, -1).transpose(1, 2) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    mask = bias(T, T).double().masked_fill(~keep, float("-inf"))
    heads = reference_attention(q, k, v, mask).float().transpose(1, 2).reshape(B, T, DIM)
    torch.testing.assert_close(layer(x, attn_mask=keep), layer.out_proj(heads), atol=1e-5, rtol=1e-5)


def _shard(layer: MultiHeadAttention, rank: int, tp: int) -> MultiHeadAttention:
    """What a tensor-parallel layer would hold on ``rank``: divided head counts, sliced projections."""
    part = copy.deepcopy(layer)
    for attribute in layer.tp_divide():
        setattr(part, attribute, getattr(layer, attribute) // tp)
    for name, style in layer.tp_plan().items():
        full = getattr(layer, name)
        if style == "colwise":
            setattr(part, name, _linear(full.weight.chunk(tp)[rank], full.bias.chunk(tp)[rank]))
        else:  # rowwise: the bias is added once, after the sum over ranks
            bias = full.bias if rank == 0 else torch.zeros_like(full.bias)
            setattr(part, name, _linear(full.weight.chunk(tp, dim=1)[rank], bias))
    return part


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("num_kv_heads", [4, 2])
def test_head_sharded_layers_sum_to_the_full_layer(fused: bool, num_kv_heads: int) -> None:
    torch.manual_seed(0)
    layer = MultiHeadAttention(DIM, HEADS, causal=True, num_kv_heads=num_kv_heads)
    layer = _fuse(layer) if fused else layer
    x = torch.randn(B, T, DIM)
    with torch.no_grad():
        parts = sum(_shard(layer, rank, 2)(x) for rank in range(2))
        torch.testing.assert_close(parts, layer(x), atol=1e-5, rtol=1e-5)


def test_tp_declarations() -> None:
    assert MultiHeadAttention(DIM, HEADS).tp_divide() == ("num_heads", "num_kv_heads")
    assert MultiHeadAttention(DIM, HEADS).tp_plan() == {
        "q_proj": "colwise",
        "k_proj": "colwise",
        "v_proj": "colwise",
        "out_proj": "rowwise",
    }
    assert MultiHeadAttention(DIM, HEADS, fused_qkv=True).tp_plan() == {
        "qkv_proj": "colwise",
        "out_proj": "rowwise",
    }


def test_attention_accepts_name_class_partial_and_instance() -> None:
    options = {"backend": "math"}
    built = [
        MultiHeadAttention(DIM, HEADS, attention="scaled_dot_product", attention_options=options),
        MultiHeadAttention(DIM, HEADS, attention=ScaledDotProduct, attention_options=options),
        MultiHeadAttention(DIM, HEADS, attention=functools.partial(ScaledDotProduct, backend="math")),
        MultiHeadAttention(DIM, HEADS, attention=ScaledDotProduct(backend="math")),
    ]
    assert options == {"backend": "math"}
    for layer in built:
        assert isinstance(layer.mechanism, ScaledDotProduct) and layer.mechanism.config.backend == "math"
    causal = MultiHeadAttention(DIM, HEADS, attention=ScaledDotProduct, causal=True)
    assert causal.causal and causal.mechanism.causal


def test_dim_head_can_differ_from_dim_model_over_heads() -> None:
    layer = MultiHeadAttention(DIM, HEADS, dim_head=6)
    assert layer.q_proj.out_features == 24 and layer.out_proj.in_features == 24
    assert layer(torch.randn(B, T, DIM)).shape == (B, T, DIM)
