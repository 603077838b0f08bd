"""xformers' ``attention_patterns`` names over ``brickwork.components.attention.pattern_masks``."""

from __future__ import annotations

import torch

from brickwork.components.attention import pattern_masks as pm
from brickwork.xformers._compat import require
from brickwork.xformers.components.attention.sparsity_config import (
    BigBirdSparsityConfig,
    BSLongformerSparsityConfig,
    FixedSparsityConfig,
    VariableSparsityConfig,
)

local_nd_distance = pm.grid_distance
local_nd_gaussian_distribution = pm.grid_gaussian
local_nd_pattern = pm.grid_local_pattern
axial_nd_pattern = pm.grid_axial_pattern
global_token_pattern = pm.global_token_pattern
random_pattern = pm.random_pattern
causal_1d_pattern = pm.causal_pattern
dilated_2d_pattern = pm.dilated_grid_pattern
layout_to_pattern = pm.layout_to_pattern
alibi_pattern = pm.alibi_pattern


def random_pattern_from_probability_matrix(dist_matrix: torch.Tensor, nnz: int) -> torch.Tensor:
    return pm.sample_pattern(dist_matrix, nnz)


def local_1d_pattern(attn_size: int, window_size: int) -> torch.Tensor:
    require(window_size % 2 == 1, "The window size is assumed to be odd (counts self-attention + 2 wings)")
    return pm.local_pattern(attn_size, window_size)


def horizontal_axial_2d_distance(H: int, W: int, p: float = 2.0) -> torch.Tensor:
    return pm.grid_distance(H, W, p=p, weights=(1, 0))


def vertical_axial_2d_distance(H: int, W: int, p: float = 2.0) -> torch.Tensor:
    return pm.grid_distance(H, W, p=p, weights=(0, 1))


def local_2d_distance(H: int, W: int, p: float = 2.0) -> torch.Tensor:
    return pm.grid_distance(H, W, p=p)


def local_2d_gausian_distribution(H: int, W: int, sigma: float = 1) -> torch.Tensor:
    return pm.grid_gaussian(H, W, sigma=sigma)


def local_2d_pattern(H: int, W: int, distance: float, p: float = 2.0) -> torch.Tensor:
    return pm.grid_local_pattern(H, W, distance=distance, p=p)


def axial_2d_pattern(H: int, W: int) -> torch.Tensor:
    return pm.grid_axial_pattern(H, W)


def swin_attention_pattern(H: int, W: int, window_size: int, shift_size: int = 0) -> torch.Tensor:
    require(H % window_size == 0 and W % window_size == 0, "the grid must be a multiple of window_size")
    require(0 <= shift_size < window_size, "shift_size must in 0-window_size")
    return pm.swin_pattern(H, W, window_size, shift_size)


def pattern_to_layout(mask: torch.Tensor, block_size: int) -> torch.Tensor:
    require(mask.ndim >= 2, "We're expecting [Heads, Seq, Seq] or [Seq, Seq]")
    require(
        mask.shape[-2] % block_size == 0 and mask.shape[-1] % block_size == 0,
        "We're only handling masks divisible by block_size",
    )
    return pm.pattern_to_layout(mask, block_size)


def quick_fixed_layout(num_heads: int, block_size: int, seq_len: int) -> torch.Tensor:
    return FixedSparsityConfig(num_heads=num_heads, block_size=block_size).make_layout(seq_len)


def quick_variable_layout(num_heads: int, block_size: int, seq_len: int) -> torch.Tensor:
    return VariableSparsityConfig(num_heads=num_heads, block_size=block_size).make_layout(seq_len)


def quick_bigbird_layout(num_heads: int, block_size: int, seq_len: int) -> torch.Tensor:
    return BigBirdSparsityConfig(num_heads=num_heads, block_size=block_size).make_layout(seq_len)


def quick_bslongformer_layout(num_heads: int, block_size: int, seq_len: int) -> torch.Tensor:
    return BSLongformerSparsityConfig(num_heads=num_heads, block_size=block_size).make_layout(seq_len)
