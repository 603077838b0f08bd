"""Row layouts of fused qkv projections: HF's [Q|K|V] and per-head orders against brickwork's groups."""

import pytest
import torch

from brickwork.components.attention.qkv_layout import QKVLayout
from brickwork.factory.hf.layout import blocks_to_groups, groups_to_blocks


def _labelled(heads: int, kv_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v weights [rows, 2] whose rows say (kind, head): kind 0 = q, 1 = k, 2 = v."""

    def rows(kind: int, n: int) -> torch.Tensor:
        head = torch.arange(n).repeat_interleave(head_dim)
        return torch.stack([torch.full_like(head, kind), head], dim=1)

    return rows(0, heads), rows(1, kv_heads), rows(2, kv_heads)


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(3, 3, 5), (6, 2, 3), (4, 1, 2)])
def test_fused_rows_are_grouped_per_kv_head(heads: int, kv_heads: int, head_dim: int) -> None:
    q, k, v = _labelled(heads, kv_heads, head_dim)
    layout = QKVLayout(heads, kv_heads, head_dim)
    fused = layout.fuse(q, k, v)
    group = heads // kv_heads
    expected = []
    for g in range(kv_heads):
        expected += [(0, g * group + j) for j in range(group) for _ in range(head_dim)]
        expected += [(1, g)] * head_dim + [(2, g)] * head_dim
    assert fused.tolist() == [list(r) for r in expected]
    for a, b in zip(layout.split(fused), (q, k, v)):
        assert torch.equal(a, b)
    assert layout.value_rows(fused).flatten(0, 2).tolist() == v.tolist()


def test_gpt2_blocks_become_neox_heads() -> None:
    """[Q|K|V] rows -> [q_h, k_h, v_h] per head, as GPT-NeoX's query_key_value lays them out."""
    heads, head_dim, dim = 3, 4, 7
    w = torch.randn(3 * heads * head_dim, dim)
    bias = torch.randn(3 * heads * head_dim)
    grouped = blocks_to_groups(w, heads, head_dim)
    neox = w.view(3, heads, head_dim, dim).transpose(0, 1).reshape(-1, dim)
    assert torch.equal(grouped, neox)
    assert torch.equal(groups_to_blocks(grouped, heads, head_dim), w)
    assert torch.equal(groups_to_blocks(blocks_to_groups(bias, heads, head_dim), heads, head_dim), bias)


def test_wrong_row_count_is_refused() -> None:
    with pytest.raises(ValueError, match="rows"):
        QKVLayout(2, 1, 3).split(torch.zeros(10, 4))
