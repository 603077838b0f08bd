"""Block-sparse layouts: which ``block_size`` x ``block_size`` tiles of the attention matrix are kept.

A layout is a LongTensor ``[num_heads, n, n]`` (``n = seq_len / block_size``), 1 = tile kept; it
feeds :class:`~brickwork.components.attention.BlockSparseAttention` (one head's layout) or a dense
mask (``pattern_masks.layout_to_pattern``). The families are those of DeepSpeed's sparse attention
(Child et al. 2019 "fixed", "variable", BigBird, Longformer), as xformers shipped them.
"""

from __future__ import annotations

import itertools

import torch

from brickwork.errors import ConfigError

DIRECTIONS = ("bidirectional", "unidirectional")


class BlockLayout:
    """Base: ``make_layout(seq_len)`` builds head 0's layout (every head's with
    ``different_layout_per_head``) and copies head 0 to the others otherwise."""

    def __init__(self, num_heads: int, block_size: int = 16, different_layout_per_head: bool = False) -> None:
        if num_heads <= 0 or block_size <= 0:
            raise ConfigError(
                f"num_heads and block_size must be positive, got {num_heads}, {block_size}", "num_heads"
            )
        self.num_heads, self.block_size = num_heads, block_size
        self.different_layout_per_head = different_layout_per_head
        self.num_layout_heads = num_heads if different_layout_per_head else 1

    def setup_layout(self, seq_len: int) -> torch.Tensor:
        """An all-zero ``[num_heads, n, n]`` layout; ValueError unless ``block_size`` divides ``seq_len``."""
        if seq_len % self.block_size:
            raise ValueError(
                f"sequence length {seq_len} is not a multiple of the block size {self.block_size}"
            )
        n = seq_len // self.block_size
        return torch.zeros(self.num_heads, n, n, dtype=torch.int64)

    def fill_head(self, head: int, layout: torch.Tensor) -> None:
        raise NotImplementedError

    def make_layout(self, seq_len: int) -> torch.Tensor:
        layout = self.setup_layout(seq_len)
        for head in range(self.num_layout_heads):
            self.fill_head(head, layout)
        if not self.different_layout_per_head:
            layout[1:] = layout[0]
        return layout


def _check_direction(attention: str, horizontal_global_attention: bool = False) -> None:
    if attention not in DIRECTIONS:
        raise ConfigError(f"unknown attention direction {attention!r}", "attention", DIRECTIONS, attention)
    if attention != "bidirectional" and horizontal_global_attention:
        raise ConfigError(
            "horizontal global attention needs bidirectional attention", "horizontal_global_attention"
        )


def _local_windows(layout: torch.Tensor, head: int, windows: list[tuple[int, int]], causal: bool) -> None:
    """Each window [start, end) attends within itself (only to earlier blocks when ``causal``)."""
    for start, end in windows:
        tile = torch.ones(end - start, end - start, dtype=layout.dtype)
        layout[head, start:end, start:end] |= tile.tril() if causal else tile


def _global_starts(starts: list[int] | None, ends: list[int] | None) -> list[int]:
    """The first block of each global range (block 0 alone when None), checked against ``ends``."""
    starts = [0] if starts is None else list(starts)
    if ends is not None and len(starts) != len(ends):
        raise ConfigError(
            f"{len(starts)} global block starts but {len(ends)} ends", "global_block_end_indices"
        )
    for start, end in zip(starts, ends or []):
        if start >= end:
            raise ConfigError(f"global block range [{start}, {end}) is empty", "global_block_end_indices")
    return starts


def _global_ranges(starts: list[int], ends: list[int] | None, n: int) -> list[tuple[int, int]]:
    if ends is None:
        return [(s, s + 1) for s in starts if s < n]
    return [(s, min(e, n)) for s, e in zip(starts, ends) if s < n]


class DenseLayout(BlockLayout):
    """Every tile kept."""

    def fill_head(self, head: int, layout: torch.Tensor) -> None:
        layout[head] = 1


class FixedLayout(BlockLayout):
    """Child et al.'s "fixed" pattern: windows of ``num_local_blocks``; the last ``num_global_blocks`` of
    each window are seen by every query (and, with ``horizontal_global_attention``, see every key).
    With ``num_different_global_patterns`` > 1, heads take different global blocks in the window."""

    def __init__(
        self,
        num_heads: int,
        block_size: int = 16,
        different_layout_per_head: bool = False,
        num_local_blocks: int = 4,
        num_global_blocks: int = 1,
        attention: str = "bidirectional",
        horizontal_global_attention: bool = False,
        num_different_global_patterns: int = 1,
    ) -> None:
        super().__init__(num_heads, block_size, different_layout_per_head)
        _check_direction(attention, horizontal_global_attention)
        if num_local_blocks % num_global_blocks:
            raise ConfigError(f"num_local_blocks={num_local_blocks} is not a multiple of num_global_blocks="
                              f"{num_global_blocks}", "num_local_blocks")  # fmt: skip
        if num_different_global_patterns > 1 and not different_layout_per_head:
            raise ConfigError(
                "different global patterns need different_layout_per_head", "num_different_global_patterns"
            )
        if num_different_global_patterns > num_local_blocks // num_global_blocks:
            raise ConfigError(f"at most {num_local_blocks // num_global_blocks} global patterns fit a window",
                              "num_different_global_patterns")  # fmt: skip
        self.num_local_blocks, self.num_global_blocks = num_local_blocks, num_global_blocks
        self.attention, self.horizontal_global_attention = attention, horizontal_global_attention
        self.num_different_global_patterns = num_different_global_patterns

    def fill_head(self, head: int, layout: torch.Tensor) -> None:
        n, w, g = layout.shape[1], self.num_local_blocks, self.num_global_blocks
        causal = self.attention == "unidirectional"
        _local_windows(layout, head, [(s, min(s + w, n)) for s in range(0, n, w)], causal)
        first = w - (1 + head % self.num_different_global_patterns) * g
        full = n - n % w
        columns = [(i, i + g) for i in range(first, full, w)]
        if full < n:  # the last, partial window still gets its global blocks, clipped to the end
            start = min(full + first, n - g)
            columns.append((start, start + g))
        for start, end in columns:
            layout[head, (start if causal else 0) :, start:end] = 1
            if self.horizontal_global_attention:
                layout[head, start:end, :] = 1


class VariableLayout(BlockLayout):
    """Windows of the sizes in ``local_window_blocks`` (the last size repeats), global block ranges
    (``global_block_indices`` to ``global_block_end_indices``) and ``num_random_blocks`` random keys
    per query block."""

    def __init__(
        self,
        num_heads: int,
        block_size: int = 16,
        different_layout_per_head: bool = False,
        num_random_blocks: int = 0,
        local_window_blocks: list[int] | None = None,
        global_block_indices: list[int] | None = None,
        global_block_end_indices: list[int] | None = None,
        attention: str = "bidirectional",
        horizontal_global_attention: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(num_heads, block_size, different_layout_per_head)
        self.num_random_blocks = num_random_blocks
        self.local_window_blocks = [4] if local_window_blocks is None else list(local_window_blocks)
        self.global_block_indices = _global_starts(global_block_indices, global_block_end_indices)
        self.global_block_end_indices = global_block_end_indices
        _check_direction(attention, horizontal_global_attention)
        self.attention, self.horizontal_global_attention = attention, horizontal_global_attention
        self.generator = generator

    def fill_head(self, head: int, layout: torch.Tensor) -> None:
        n = layout.shape[1]
        causal = self.attention == "unidirectional"
        _random_blocks(layout, head, self.num_random_blocks, False, self.generator)
        sizes = self.local_window_blocks
        # Window bounds: the given sizes, then the last size repeated past the end.
        bounds = list(itertools.accumulate(sizes, initial=0))
        bounds += range(bounds[-1] + sizes[-1], n + sizes[-1], sizes[-1])
        _local_windows(layout, head, [(s, min(e, n)) for s, e in itertools.pairwise(bounds) if s < n], causal)
        for s, e in _global_ranges(self.global_block_indices, self.global_block_end_indices, n):
            if self.horizontal_global_attention:
                layout[head, s:e, :] = 1
            layout[head, (s if causal else 0) :, s:e] = 1


def _random_blocks(
    layout: torch.Tensor, head: int, count: int, causal: bool, generator: torch.Generator | None
) -> None:
    """``count`` distinct random key blocks per query block (among the earlier ones when ``causal``)."""
    n = layout.shape[1]
    if n < count:
        raise ValueError(f"{count} random blocks do not fit {n} blocks")
    if count == 0:
        return
    for row in range(n):
        pool = row + 1 if causal else n
        if pool < count:
            raise ValueError(f"query block {row} has fewer than {count} blocks to sample from")
        layout[head, row, torch.randperm(pool, generator=generator)[:count]] = 1


class BigBirdLayout(BlockLayout):
    """BigBird: random blocks, a sliding window of ``num_sliding_window_blocks`` and the first
    ``num_global_blocks`` blocks global both ways."""

    def __init__(
        self,
        num_heads: int,
        block_size: int = 16,
        different_layout_per_head: bool = False,
        num_random_blocks: int = 1,
        num_sliding_window_blocks: int = 3,
        num_global_blocks: int = 1,
        attention: str = "bidirectional",
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(num_heads, block_size, different_layout_per_head)
        _check_direction(attention)
        self.num_random_blocks, self.num_sliding_window_blocks = num_random_blocks, num_sliding_window_blocks
        self.num_global_blocks, self.attention, self.generator = num_global_blocks, attention, generator

    def fill_head(self, head: int, layout: torch.Tensor) -> None:
        n = layout.shape[1]
        causal = self.attention == "unidirectional"
        _random_blocks(layout, head, self.num_random_blocks, causal, self.generator)
        _sliding_window(layout, head, self.num_sliding_window_blocks)
        if n < self.num_global_blocks:
            raise ValueError(f"{self.num_global_blocks} global blocks do not fit {n} blocks")
        layout[head, : self.num_global_blocks, :] = 1
        layout[head, :, : self.num_global_blocks] = 1
        if causal:
            layout[head] = layout[head].tril()


def _sliding_window(layout: torch.Tensor, head: int, width: int) -> None:
    n = layout.shape[1]
    if n < width:
        raise ValueError(f"a sliding window of {width} blocks does not fit {n} blocks")
    rows = torch.arange(n)
    layout[head] |= ((rows[:, None] - rows[None, :]).abs() <= width // 2).to(layout.dtype)


class LongformerLayout(BlockLayout):
    """Block-sparse Longformer: a sliding window plus global block ranges seen by and seeing all."""

    def __init__(
        self,
        num_heads: int,
        block_size: int = 16,
        different_layout_per_head: bool = False,
        num_sliding_window_blocks: int = 3,
        global_block_indices: list[int] | None = None,
        global_block_end_indices: list[int] | None = None,
        attention: str = "bidirectional",
    ) -> None:
        super().__init__(num_heads, block_size, different_layout_per_head)
        _check_direction(attention)
        self.num_sliding_window_blocks = num_sliding_window_blocks
        self.global_block_indices = _global_starts(global_block_indices, global_block_end_indices)
        self.global_block_end_indices, self.attention = global_block_end_indices, attention

    def fill_head(self, head: int, layout: torch.Tensor) -> None:
        n = layout.shape[1]
        _sliding_window(layout, head, self.num_sliding_window_blocks)
        for s, e in _global_ranges(self.global_block_indices, self.global_block_end_indices, n):
            layout[head, s:e, :] = 1
            layout[head, :, s:e] = 1
        if self.attention == "unidirectional":
            layout[head] = layout[head].tril()
