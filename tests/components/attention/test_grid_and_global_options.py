"""Options added for xformers' mechanisms, checked against formulas written here: global attention over
any positions, 2-D grid pooling, Orthoformer landmark selection, compositional score networks, and
the block layouts / pattern helpers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from brickwork.components.attention import (
    CompositionalAttention,
    GlobalAttention,
    OrthoformerAttention,
    Pooling,
)
from brickwork.components.attention.block_layouts import FixedLayout, LongformerLayout
from brickwork.components.attention.pattern_masks import layout_to_pattern, pattern_to_layout
from brickwork.errors import ConfigError


def _exact(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    scores = (q.double() @ k.double().transpose(-2, -1)) / q.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1) @ v.double()


def test_global_positions_pattern() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 10, 8) for _ in range(3))
    layer = GlobalAttention(num_global_tokens=None, global_positions=[3, 7])
    g = torch.zeros(10, dtype=torch.bool)
    g[[3, 7]] = True
    keep = g[:, None] | g[None, :] | torch.eye(10, dtype=torch.bool)
    torch.testing.assert_close(layer(q, k, v).double(), _exact(q, k, v, keep), atol=1e-5, rtol=1e-5)
    # No global position at all: each token sees itself.
    torch.testing.assert_close(GlobalAttention(num_global_tokens=None, global_positions=[])(q, k, v), v)


def test_global_positions_options_are_exclusive() -> None:
    with pytest.raises(ConfigError, match="num_global_tokens"):
        GlobalAttention(global_positions=[1])
    with pytest.raises(ConfigError, match="global_positions"):
        GlobalAttention(num_global_tokens=None, global_positions=[-1])


def test_grid_pooling_matches_avg_pool2d() -> None:
    torch.manual_seed(0)
    v = torch.randn(2, 1, 16, 6)
    out = Pooling(pool_size=3, grid=True)(v, v, v)
    grid = v[:, 0].transpose(1, 2).reshape(2, 6, 4, 4)
    ref = (
        F.avg_pool2d(grid, 3, stride=1, padding=1, count_include_pad=False).reshape(2, 6, 16).transpose(1, 2)
    )
    torch.testing.assert_close(out[:, 0], ref - v[:, 0])
    with pytest.raises(ValueError, match="square"):
        Pooling(grid=True)(v[:, :, :15], v[:, :, :15], v[:, :, :15])


@pytest.mark.parametrize("selection", ["orthogonal", "kmeans", "kmeans_spherical", "random"])
def test_ortho_landmark_selection_approximates_attention(selection: str) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.rand(2, 2, 128, 16) for _ in range(3))
    out = OrthoformerAttention(num_landmarks=16, landmark_selection=selection)(q, k, v)
    exact = _exact(q, k, v, torch.ones(128, 128, dtype=torch.bool))
    assert (out.double() - exact).abs().max() < 0.1


def test_ortho_kmeans_with_every_key_a_centroid_is_exact() -> None:
    """With as many landmarks as distinct keys, the centroids are the keys: the result is exact."""
    torch.manual_seed(0)
    q = torch.rand(1, 1, 40, 8)
    k = torch.rand(1, 1, 4, 8).repeat_interleave(10, dim=2)  # 4 distinct keys, 10 copies each
    v = torch.rand(1, 1, 40, 8)
    out = OrthoformerAttention(num_landmarks=4, landmark_selection="kmeans")(q, k, v)
    # softmax(q Lᵀ) softmax(L kᵀ) v with L = the 4 distinct keys.
    land = k[:, :, ::10]
    ref = torch.softmax(q @ land.transpose(-2, -1) / 8**0.5, -1) @ (
        torch.softmax(land @ k.transpose(-2, -1) / 8**0.5, -1) @ v
    )
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("selection", ["linear", "mlp"])
def test_compositional_score_network(selection: str) -> None:
    torch.manual_seed(0)
    layer = CompositionalAttention(num_heads=2, dim_head=4, num_rules=3, selection=selection).double()
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64) for _ in range(3))
    rules = torch.einsum("bhtd,hr->brtd", v, layer.rule_mix)
    retrieved = torch.stack(
        [
            torch.stack(
                [_exact(q[:, s], k[:, s], rules[:, r], torch.ones(5, 5, dtype=torch.bool)) for r in range(3)],
                1,
            )
            for s in range(2)
        ],
        1,
    )  # (B, H, R, T, D)
    query = layer.selection_query(q).unsqueeze(2).expand(-1, -1, 3, -1, -1)
    scores = layer.score_network(torch.cat([retrieved, query], -1)).squeeze(-1)
    ref = (torch.softmax(scores, dim=2).unsqueeze(-1) * retrieved).sum(2)
    torch.testing.assert_close(layer(q, k, v), ref)


def test_layouts_and_patterns_round_trip() -> None:
    layout = LongformerLayout(num_heads=2, block_size=4).make_layout(32)
    assert layout.shape == (2, 8, 8) and torch.equal(layout[0], layout[1])
    assert torch.equal(pattern_to_layout(layout_to_pattern(layout, 4).bool(), 4), layout)
    with pytest.raises(ValueError, match="multiple"):
        FixedLayout(num_heads=1).make_layout(17)
    with pytest.raises(ConfigError, match="attention"):
        FixedLayout(num_heads=1, attention="sideways")
