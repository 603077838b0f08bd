"""The sparsity patterns xformers offered beside ``local``: ``random``, ``global`` and ``blocksparse``.

Each is a :class:`~brickwork.components.attention.sparse.PatternAttention`: one ``keep`` function, run
as a FlexAttention block mask or as a dense mask (docs/spec.md lists the options).
"""

from __future__ import annotations

from typing import Any

import torch

from brickwork.checks import Flag, PositiveInt, Probability
from brickwork.components.attention.base import register_attention
from brickwork.components.attention.sparse import Backend, PatternAttention
from brickwork.errors import ConfigError

_HASH_BITS = 16


@register_attention("random")
class RandomAttention(PatternAttention):
    """Each query sees itself and a fixed random fraction ``r`` of the keys (xformers' ``random`` with
    ``constant_masking``). The draw is a hash of (query position, key position, ``seed``), the same on
    every call, device and backend, so it needs no stored mask and covers any length."""

    def __init__(
        self,
        r: Probability = 0.1,
        seed: int = 0,
        causal: Flag = False,
        dropout: Probability = 0.0,
        backend: Backend = "auto",
    ) -> None:
        super().__init__(causal, dropout, backend)
        self.r, self.seed = r, seed
        self._threshold = int(r * (1 << _HASH_BITS))

    @staticmethod
    def check_options(options: Any) -> None:
        seed = options.seed
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
            raise ConfigError(f"must be an integer in [0, 2^31), got {seed!r}", "seed")

    def keep(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        # int32 arithmetic wraps the same way on every backend, so both paths draw the same keys.
        q, k = q_pos.to(torch.int32), k_pos.to(torch.int32)
        h = q * 1103515245 + k * 214013 + self.seed
        h = (h ^ (h >> 13)) * 1664525
        drawn = ((h >> 8) & ((1 << _HASH_BITS) - 1)) < self._threshold
        return drawn | (q == k)


@register_attention("global")
class GlobalAttention(PatternAttention):
    """Global tokens attend to every key and every query attends to them; the other tokens see only
    those and themselves (BigBird / Longformer global attention). By default the global tokens are the
    first ``num_global_tokens`` positions (e.g. a class token); ``global_positions`` names any set of
    positions instead (xformers' ``attention_query_mask``), and then ``num_global_tokens`` stays unset."""

    def __init__(
        self,
        num_global_tokens: PositiveInt | None = 1,
        causal: Flag = False,
        dropout: Probability = 0.0,
        backend: Backend = "auto",
        global_positions: list[int] | None = None,
    ) -> None:
        super().__init__(causal, dropout, backend)
        self.num_global_tokens, self.global_positions = num_global_tokens, global_positions
        if global_positions is not None:
            flags = torch.zeros(max(global_positions, default=-1) + 1, dtype=torch.bool)
            flags[list(global_positions)] = True
            self.register_buffer("global_flags", flags, persistent=False)

    @staticmethod
    def check_options(options: Any) -> None:
        positions = options.global_positions
        if positions is None:
            if options.num_global_tokens is None:
                raise ConfigError("give num_global_tokens or global_positions", "num_global_tokens")
            return
        if options.num_global_tokens is not None:
            raise ConfigError(
                "give num_global_tokens (a prefix) or global_positions, not both; set it to null",
                "num_global_tokens",
            )
        if not isinstance(positions, list | tuple) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in positions
        ):
            raise ConfigError(
                f"must be a list of non-negative positions, got {positions!r}", "global_positions"
            )

    def is_global(self, pos: torch.Tensor) -> torch.Tensor:
        if self.global_positions is None:
            return pos < self.num_global_tokens
        flags = self.global_flags.to(pos.device)
        if flags.numel() == 0:
            return torch.zeros_like(pos, dtype=torch.bool)
        # Positions past the last global one are ordinary tokens.
        return flags[pos.clamp(max=flags.numel() - 1)] & (pos < flags.numel())

    def keep(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        return self.is_global(k_pos) | self.is_global(q_pos) | (q_pos == k_pos)


@register_attention("blocksparse")
class BlockSparseAttention(PatternAttention):
    """Attention over ``block_size`` x ``block_size`` tiles chosen by ``layout`` (xformers'
    ``blocksparse``): ``layout[i][j]`` true lets query block i see key block j; one layout serves
    every head. Without a layout, each block sees itself, the block before it and the first block
    (local plus a global block), for any length. With one, sequences may span at most its size."""

    def __init__(
        self,
        block_size: PositiveInt = 16,
        layout: list[list[bool]] | None = None,
        causal: Flag = False,
        dropout: Probability = 0.0,
        backend: Backend = "auto",
    ) -> None:
        super().__init__(causal, dropout, backend)
        self.block_size = block_size
        self.layout = layout
        if layout is not None:
            self.register_buffer("layout_mask", torch.tensor(layout, dtype=torch.bool), persistent=False)

    @staticmethod
    def check_options(options: Any) -> None:
        layout = options.layout
        if layout is None:
            return
        rows = len(layout) if isinstance(layout, list | tuple) else 0
        square = rows > 0 and all(isinstance(r, list | tuple) and len(r) == rows for r in layout)
        if not square or not all(isinstance(x, bool | int) for r in layout for x in r):
            raise ConfigError(
                "must be a square list of lists of booleans (one layout for all heads)", "layout"
            )

    def keep(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        qb, kb = q_pos // self.block_size, k_pos // self.block_size
        if self.layout is None:
            return (qb == kb) | (qb == kb + 1) | (kb == 0)
        return self.layout_mask[qb, kb]

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """As :class:`PatternAttention`; the keys may span at most ``len(layout) * block_size``."""
        if self.layout is not None and k.shape[-2] > len(self.layout) * self.block_size:
            raise ValueError(
                f"BlockSparseAttention: {k.shape[-2]} keys exceed the layout's "
                f"{len(self.layout)} blocks of {self.block_size}"
            )
        return super().forward(q, k, v, attn_mask)
