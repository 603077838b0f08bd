"""Row layouts of fused attention projections, converted between HF and brickwork.

brickwork's fused ``qkv_proj`` holds its rows per kv group: for each of the ``Hkv`` groups, the
``H / Hkv`` query heads of that group, then the group's key head, then its value head (``D`` rows
each). GPT-2's ``c_attn`` instead holds all query rows, then all key rows, then all value rows;
GPT-NeoX's ``query_key_value`` holds ``[q_h, k_h, v_h]`` per head, which is brickwork's layout when
``Hkv == H``. A bias follows the rows of its weight, so the same functions take 1-D biases.
"""

from __future__ import annotations

import torch


def _check(name: str, rows: int, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    want = (num_heads + 2 * num_kv_heads) * head_dim
    if rows != want:
        raise ValueError(f"{name} has {rows} rows, expected (H + 2 * Hkv) * D = {want}")


def fuse_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int
) -> torch.Tensor:
    """Separate q [H*D, ...], k and v [Hkv*D, ...] -> brickwork's fused [(H + 2 Hkv) * D, ...]."""
    group = num_heads // num_kv_heads
    tail = q.shape[1:]
    q = q.reshape(num_kv_heads, group * head_dim, *tail)
    k = k.reshape(num_kv_heads, head_dim, *tail)
    v = v.reshape(num_kv_heads, head_dim, *tail)
    fused = torch.cat([q, k, v], dim=1).reshape(-1, *tail)
    _check("the fused qkv", fused.shape[0], num_heads, num_kv_heads, head_dim)
    return fused


def split_qkv(
    fused: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """brickwork's fused [(H + 2 Hkv) * D, ...] -> q [H*D, ...], k [Hkv*D, ...], v [Hkv*D, ...]."""
    _check("the fused qkv", fused.shape[0], num_heads, num_kv_heads, head_dim)
    group = num_heads // num_kv_heads
    tail = fused.shape[1:]
    grouped = fused.reshape(num_kv_heads, (group + 2) * head_dim, *tail)
    q, k, v = grouped.split([group * head_dim, head_dim, head_dim], dim=1)
    return q.reshape(-1, *tail), k.reshape(-1, *tail), v.reshape(-1, *tail)


def blocks_to_groups(qkv: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
    """Rows [Q | K | V] (GPT-2, ``Hkv == H``) -> brickwork's per-group rows."""
    q, k, v = qkv.chunk(3, dim=0)
    return fuse_qkv(q, k, v, num_heads, num_heads, head_dim)


def groups_to_blocks(fused: torch.Tensor, num_heads: int, head_dim: int) -> torch.Tensor:
    """brickwork's per-group rows (``Hkv == H``) -> rows [Q | K | V]."""
    return torch.cat(split_qkv(fused, num_heads, num_heads, head_dim), dim=0)
