"""FourierMix (FNet) against an explicit DFT, Pooling (PoolFormer) against a windowed mean."""

import functools
import math

import pytest
import torch
import torch.nn.functional as F

from brickwork.components.attention import FourierMix, MultiHeadAttention, Pooling, VisualAttention
from brickwork.errors import ConfigError
from brickwork.parallel.tensor.checks import check_tensor_parallel
from brickwork.parallel.tensor.plan import component_plan


def _dft(n: int) -> torch.Tensor:
    index = torch.arange(n, dtype=torch.float64)
    return torch.exp(-2j * math.pi * index[:, None] * index[None, :] / n)


def test_fourier_mix_is_real_part_of_2d_dft() -> None:
    x = torch.randn(2, 3, 7, 6)
    expected = (_dft(7) @ x.double().to(torch.complex128) @ _dft(6)).real
    torch.testing.assert_close(FourierMix()(x, x, x), expected.float(), atol=1e-5, rtol=1e-5)


def test_fourier_mix_layer_is_fnet_over_the_hidden_state() -> None:
    torch.manual_seed(0)
    layer = MultiHeadAttention(12, 1, attention="fourier_mix")
    assert sorted(name for name, _ in layer.named_parameters()) == ["out_proj.bias", "out_proj.weight"]
    assert layer.tp_plan() == {"out_proj": "replicate"} and layer.tp_divide() == ()
    x = torch.randn(2, 5, 12)
    mixed = (_dft(5) @ x.double().to(torch.complex128) @ _dft(12)).real.float()
    torch.testing.assert_close(layer(x), layer.out_proj(mixed), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pool_size", [1, 3, 5])
def test_pooling_is_windowed_mean_minus_input(pool_size: int) -> None:
    x = torch.randn(2, 2, 6, 4)
    half = pool_size // 2
    expected = torch.stack(
        [x[:, :, max(0, t - half) : t + half + 1].mean(dim=2) for t in range(6)], dim=2
    )  # windows clipped at the ends
    torch.testing.assert_close(Pooling(pool_size=pool_size)(x, x, x), expected - x)


@pytest.mark.parametrize("mixer", [FourierMix, Pooling, functools.partial(VisualAttention, 2, 4)])
def test_mixers_refuse_masks_and_ragged_lengths(mixer: type) -> None:
    x = torch.randn(1, 2, 4, 4)  # 4 tokens: a 2 x 2 grid for VisualAttention
    with pytest.raises(ValueError, match="attn_mask"):
        mixer()(x, x, x, torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="as many queries"):
        mixer()(x[:, :, :3], x, x)


def test_mixer_layers_refuse_what_they_cannot_use() -> None:
    with pytest.raises(ConfigError, match="pool_size"):
        Pooling(pool_size=4)
    with pytest.raises(ConfigError, match="rotary"):
        MultiHeadAttention(8, 2, attention="pooling", rotary=lambda q, k, offset=0: (q, k))
    with pytest.raises(ConfigError, match="num_kv_heads"):
        MultiHeadAttention(8, 2, attention="fourier_mix", num_kv_heads=1)
    with pytest.raises(ConfigError, match="dim_head"):
        MultiHeadAttention(8, 2, attention="fourier_mix", dim_head=3)
    layer = MultiHeadAttention(8, 2, attention="pooling")
    x = torch.randn(1, 4, 8)
    with pytest.raises(ValueError, match="memory"):
        layer(x, memory=x)


def test_single_head_mixer_passes_the_tensor_parallel_check() -> None:
    # The mixer has no heads to split, so a TP size that does not divide num_heads=1 is fine.
    layer = MultiHeadAttention(16, 1, attention="fourier_mix")
    check_tensor_parallel(layer, component_plan(layer), 2)
    attention = MultiHeadAttention(16, 1)
    with pytest.raises(ValueError, match="num_heads"):
        check_tensor_parallel(attention, component_plan(attention), 2)


def test_visual_attention_gates_the_grid_by_its_large_kernel_convolutions() -> None:
    torch.manual_seed(0)
    layer = MultiHeadAttention(8, 2, attention="visual")
    mixer = layer.mechanism
    x = torch.randn(2, 16, 8)
    grid = x.view(2, 4, 4, 8).permute(0, 3, 1, 2)  # tokens row by row on a 4 x 4 grid
    attn = F.conv2d(grid, mixer.depthwise.weight, mixer.depthwise.bias, padding=2, groups=8)
    attn = F.conv2d(attn, mixer.dilated.weight, mixer.dilated.bias, padding=9, dilation=3, groups=8)
    attn = F.conv2d(attn, mixer.pointwise.weight, mixer.pointwise.bias)
    mixed = (grid * attn).permute(0, 2, 3, 1).reshape(2, 16, 8)
    torch.testing.assert_close(layer(x), layer.out_proj(mixed), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="square number of tokens"):
        layer(torch.randn(2, 10, 8))


def test_a_mechanism_over_all_heads_runs_whole_under_tensor_parallel() -> None:
    # Compositional attention mixes rules from every head, so no rank may hold a subset of them:
    # the layer is replicated (and any TP size passes the check), where plain attention splits.
    layer = MultiHeadAttention(18, 3, attention="compositional")
    assert not layer.splits_by_head() and layer.tp_divide() == ()
    assert set(layer.tp_plan().values()) == {"replicate"}
    check_tensor_parallel(layer, component_plan(layer), 2)
    assert MultiHeadAttention(16, 4).splits_by_head()
