"""Per-layer key/value cache for incremental decoding."""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values of the positions seen so far, ``[B, Hkv, length, D]`` each.

    One cache per attention layer. :meth:`update` appends the new positions' k/v and returns all of
    them; ``length`` is the number of cached positions (the position offset of the next token).
    """

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k/v ``[B, Hkv, T, D]``; returns the cached plus new ``[B, Hkv, length + T, D]`` pair."""
        if k.dim() != 4 or k.shape != v.shape:
            raise ValueError(
                "KVCache.update: k and v must both be [B, Hkv, T, D], "
                f"got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        if self.keys is None or self.values is None:
            self.keys, self.values = k, v
        else:
            held = self.keys.shape
            if k.shape[:2] != held[:2] or k.shape[-1] != held[-1]:
                raise ValueError(
                    f"KVCache.update: new k/v {tuple(k.shape)} do not continue the cached {tuple(held)} "
                    "(batch, kv heads and head dim must match)"
                )
            self.keys = torch.cat([self.keys, k], dim=-2)
            self.values = torch.cat([self.values, v], dim=-2)
        return self.keys, self.values

    def reset(self) -> None:
        """Forget every cached position."""
        self.keys = self.values = None
