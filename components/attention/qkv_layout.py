"""The row layout of a fused q/k/v projection, stated once.

A fused ``qkv_proj`` holds its rows per kv group: for each of the ``Hkv`` groups, the ``H / Hkv``
query heads of that group, then the group's key head, then its value head (``D`` rows each). A
column-wise tensor-parallel split of it thus hands each rank whole groups. The same layout applies
along the last dim of the projection's output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class QKVLayout:
    """``(H + 2 Hkv) * D`` fused rows as ``Hkv`` groups of ``H/Hkv + 2`` heads of ``D`` rows."""

    num_heads: int
    num_kv_heads: int
    dim_head: int

    @property
    def group(self) -> int:
        """Query heads per kv head."""
        return self.num_heads // self.num_kv_heads

    @property
    def size(self) -> int:
        return (self.num_heads + 2 * self.num_kv_heads) * self.dim_head

    def grouped(self, fused: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """A view of ``fused`` with ``dim`` unfolded to ``(Hkv, H/Hkv + 2, D)``: index ``[:group]`` of the
        second is the group's query heads, ``group`` its key head, ``group + 1`` its value head."""
        dim = dim % fused.dim()
        if fused.shape[dim] != self.size:
            raise ValueError(
                f"a fused qkv of {fused.shape[dim]} rows along dim {dim}; this layout has "
                f"(H + 2 * Hkv) * D = {self.size}"
            )
        shape = (
            *fused.shape[:dim],
            self.num_kv_heads,
            self.group + 2,
            self.dim_head,
            *fused.shape[dim + 1 :],
        )
        return fused.view(shape)

    def split(self, fused: torch.Tensor, dim: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q ``[.., H * D, ..]``, k and v ``[.., Hkv * D, ..]`` along ``dim`` (copies where not views)."""
        dim = dim % fused.dim()
        grouped = self.grouped(fused, dim)
        g = self.group

        def take(lo: int, hi: int) -> torch.Tensor:
            part = grouped.narrow(dim + 1, lo, hi - lo)
            return part.reshape(*fused.shape[:dim], -1, *fused.shape[dim + 1 :])

        return take(0, g), take(g, g + 1), take(g + 1, g + 2)

    def fuse(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """The inverse of :meth:`split`."""
        dim = dim % q.dim()
        parts = []
        for t, heads in ((q, self.group), (k, 1), (v, 1)):
            shape = (*t.shape[:dim], self.num_kv_heads, heads, self.dim_head, *t.shape[dim + 1 :])
            parts.append(t.reshape(shape))
        fused = torch.cat(parts, dim=dim + 1)
        return fused.reshape(*q.shape[:dim], self.size, *q.shape[dim + 1 :])

    def value_rows(self, fused: torch.Tensor) -> torch.Tensor:
        """A view of the value rows of a fused weight or bias ``[(H + 2 Hkv) * D, ...]``, for in-place
        edits: ``[Hkv, 1, D, ...]``."""
        return self.grouped(fused).narrow(1, self.group + 1, 1)
