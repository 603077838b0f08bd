"""Row layouts of fused attention projections, converted between HF and brickwork.

brickwork's fused ``qkv_proj`` holds its rows as :class:`~brickwork.components.attention.qkv_layout.
QKVLayout` says (per kv group: its query heads, its key head, its value head). GPT-2's ``c_attn``
instead holds all query rows, then all key rows, then all value rows; GPT-NeoX's ``query_key_value``
holds ``[q_h, k_h, v_h]`` per head, which is brickwork's layout when ``Hkv == H``. A bias follows the
rows of its weight, so the same functions take 1-D biases.
"""

from __future__ import annotations

import torch

from brickwork.components.attention.qkv_layout import QKVLayout


def blocks_to_groups(qkv: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
    """Rows [Q | K | V] (GPT-2, ``Hkv == H``) -> brickwork's per-group rows."""
    return QKVLayout(num_heads, num_heads, head_dim).fuse(*qkv.chunk(3, dim=0))


def groups_to_blocks(fused: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
    """brickwork's per-group rows (``Hkv == H``) -> rows [Q | K | V]."""
    return torch.cat(QKVLayout(num_heads, num_heads, head_dim).split(fused), dim=0)
