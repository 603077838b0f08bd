"""Dense boolean attention patterns (True = may attend) over 1-D sequences and 2-D grids, and the
conversions between a pattern and a block-sparse layout (``block_layouts``).

Grid positions are numbered row-major: token ``i * W + j`` sits at row i, column j.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from brickwork.components.positional.alibi import alibi_slopes


def _grid(*sizes: int) -> list[torch.Tensor]:
    """The flattened coordinates of an n-d grid, one ``[prod(sizes)]`` tensor per axis."""
    return [c.flatten() for c in torch.meshgrid(*(torch.arange(s) for s in sizes), indexing="ij")]


def grid_distance(*sizes: int, p: float = 2.0, weights: tuple[float, ...] | None = None) -> torch.Tensor:
    """``[N, N]`` Minkowski-``p`` distances between the points of a grid (``p=0`` counts differing
    axes); ``weights`` scale each axis (0 drops it)."""
    weights = (1.0,) * len(sizes) if weights is None else weights
    if len(weights) != len(sizes):
        raise ValueError(f"{len(weights)} weights for {len(sizes)} axes")
    points = torch.stack([c * w for c, w in zip(_grid(*sizes), weights)], dim=1).float()
    return torch.cdist(points, points, p=p)


def grid_gaussian(*sizes: int, sigma: float = 1.0) -> torch.Tensor:
    """``exp(-d² / 2σ²)`` over the grid's Euclidean distances."""
    return torch.exp(-0.5 * sigma**-2.0 * grid_distance(*sizes, p=2.0) ** 2)


def grid_local_pattern(*sizes: int, distance: float, p: float = 2.0) -> torch.Tensor:
    """Tokens closer than ``distance``."""
    return grid_distance(*sizes, p=p) < distance


def grid_axial_pattern(*sizes: int) -> torch.Tensor:
    """Tokens sharing all but at most one coordinate (same row or same column in 2-D)."""
    return grid_distance(*sizes, p=0) < 2


def local_pattern(length: int, window_size: int) -> torch.Tensor:
    """``[T, T]``: |i - j| <= window_size // 2; ``window_size`` is odd (itself and two wings)."""
    if window_size % 2 != 1:
        raise ValueError(f"window_size counts the token and two equal wings, so it is odd; got {window_size}")
    pos = torch.arange(length)
    return (pos[:, None] - pos[None, :]).abs() <= window_size // 2


def causal_pattern(length: int) -> torch.Tensor:
    return torch.ones(length, length, dtype=torch.bool).tril()


def global_token_pattern(is_global: torch.Tensor) -> torch.Tensor:
    """``[T, T]`` from a boolean ``[T]``: global tokens see all and are seen by all."""
    if is_global.ndim != 1 or is_global.dtype != torch.bool:
        raise ValueError(f"expected a boolean [T] tensor, got {is_global.dtype} {tuple(is_global.shape)}")
    return is_global[None, :] | is_global[:, None]


def random_pattern(length: int, sparsity: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Each pair kept with probability ``1 - sparsity``."""
    if not 0 < sparsity < 1:
        raise ValueError(f"sparsity must be in (0, 1), got {sparsity}")
    return torch.rand(length, length, generator=generator) > sparsity


def sample_pattern(
    weights: torch.Tensor, count: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``count`` distinct pairs drawn with probability proportional to ``weights`` ``[T, T]``."""
    keep = torch.zeros_like(weights, dtype=torch.bool)
    keep.view(-1)[torch.multinomial(weights.flatten().double(), count, generator=generator)] = True
    return keep


def swin_pattern(height: int, width: int, window_size: int, shift_size: int = 0) -> torch.Tensor:
    """Swin Transformer windows on an ``height x width`` grid, shifted by ``shift_size``: tokens attend
    within the same (possibly shifted, edge-clipped) ``window_size`` x ``window_size`` window."""
    if height % window_size or width % window_size:
        raise ValueError(f"the grid {height}x{width} is not a multiple of window_size={window_size}")
    if not 0 <= shift_size < window_size:
        raise ValueError(f"shift_size must be in [0, {window_size}), got {shift_size}")
    rows, cols = _grid(height, width)
    shift = (-shift_size) % window_size
    # A token belongs to the window whose cell (after the shift) contains it.
    window_row = torch.div(rows + shift, window_size, rounding_mode="floor") if shift else rows // window_size
    window_col = torch.div(cols + shift, window_size, rounding_mode="floor") if shift else cols // window_size
    window = window_row * (width + window_size) + window_col
    return window[:, None] == window[None, :]


def dilated_grid_pattern(height: int, width: int, step: int = 2) -> torch.Tensor:
    """Each token sees the tokens whose row and column offsets are multiples of ``step``."""
    rows, cols = _grid(height, width)
    return ((rows[:, None] - rows[None, :]) % step == 0) & ((cols[:, None] - cols[None, :]) % step == 0)


def pattern_to_layout(mask: torch.Tensor, block_size: int) -> torch.Tensor:
    """The block-sparse layout ``[..., T/b, T/b]`` (LongTensor) covering every True of ``mask``."""
    if mask.ndim < 2:
        raise ValueError(f"expected a [T, T] or [H, T, T] mask, got shape {tuple(mask.shape)}")
    squeeze = mask.ndim == 2
    mask = mask.unsqueeze(0) if squeeze else mask
    if mask.shape[-2] % block_size or mask.shape[-1] % block_size:
        raise ValueError(f"mask of shape {tuple(mask.shape)} is not a multiple of block_size={block_size}")
    layout = F.max_pool2d(mask.float(), kernel_size=block_size, stride=block_size).long()
    return layout.squeeze(0) if squeeze else layout


def layout_to_pattern(layout: torch.Tensor, block_size: int) -> torch.Tensor:
    """The dense ``[H, T, T]`` pattern (float 0/1) of a ``[H, T/b, T/b]`` layout."""
    return torch.kron(layout, torch.ones(block_size, block_size))


def alibi_pattern(threshold: float, mask_shape: tuple[int, int, int]) -> torch.Tensor:
    """``[H, 1, T]``: key distances whose ALiBi penalty (slope x distance) stays below ``threshold``."""
    heads, length = mask_shape[0], mask_shape[1]
    slopes = torch.tensor(alibi_slopes(heads))
    return (slopes[:, None, None] * torch.arange(length)[None, None, :]) < threshold
