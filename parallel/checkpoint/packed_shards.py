"""A packed ``colwise:N`` parameter as a checkpoint sees it: in the single-process column order.

A ``colwise:N`` split (HF GPT-2's fused q|k|v) reorders the packed dim before sharding, so that each
rank's contiguous shard holds its part of every segment (parallel/tensor/styles.py). That order depends on
the TP size, so a checkpoint cannot store the DTensor as it is. :class:`NaturalOrderShards` shows
DCP the parameter in the model's own order: the global shape of the single-process tensor, and this
rank's local shard as one chunk per run of columns that stay consecutive there (N runs under plain
TP). The chunks are views of the local shard, so DCP writes them from it and loads straight into it,
under any other layout: DCP reads, for each chunk a rank holds now, the stored pieces it overlaps.

It implements DCP's checkpoint protocol (``__create_write_items__``, ``__create_chunk_list__``,
``__get_tensor_shard__``), as DTensor does; it is a tensor only to DCP's planners and supports no
other operation.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType
from torch.distributed.tensor import DTensor


class NaturalOrderShards(torch.Tensor):
    """This rank's pieces of a tensor of ``size`` (the single-process shape), each at its offset."""

    _pieces: list[torch.Tensor]
    _chunks: list[ChunkStorageMetadata]

    @staticmethod
    def __new__(
        cls, size: torch.Size, pieces: list[torch.Tensor], offsets: list[tuple[int, ...]]
    ) -> NaturalOrderShards:
        first = pieces[0]
        out = torch.Tensor._make_wrapper_subclass(cls, size, dtype=first.dtype, device=first.device)
        out._pieces = pieces
        out._chunks = [
            ChunkStorageMetadata(offsets=torch.Size(offset), sizes=piece.shape)
            for piece, offset in zip(pieces, offsets)
        ]
        return out

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is torch.ops.aten.detach.default:
            return args[0]
        raise NotImplementedError(f"{func} on a checkpoint view of a packed parameter")

    def __create_write_items__(self, fqn: str, obj: Any) -> list[WriteItem]:
        properties = TensorProperties.create_from_tensor(self._pieces[0])
        return [
            WriteItem(
                index=MetadataIndex(fqn, chunk.offsets),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(chunk=chunk, properties=properties, size=self.shape),
            )
            for chunk in self._chunks
        ]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return list(self._chunks)

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        # By offset: DCP rewrites ``index.index`` to the chunk's place among every rank's chunks.
        for piece, chunk in zip(self._pieces, self._chunks):
            if chunk.offsets == index.offset:
                return piece
        raise ValueError(f"no local chunk of {index.fqn} at offset {index.offset}")


def natural_order_view(packed: DTensor, dim: int, order: torch.Tensor) -> NaturalOrderShards:
    """``packed`` (a DTensor whose ``dim`` is stored as ``natural.index_select(dim, order)``) as the
    single-process tensor's chunks this rank holds, sharing its local storage."""
    (chunk,) = packed.__create_chunk_list__()  # this rank's block of the packed global tensor
    local = packed.to_local()
    start = chunk.offsets[dim]
    natural = order[start : start + chunk.sizes[dim]].tolist()
    pieces, offsets = [], []
    begin = 0
    for i in range(1, len(natural) + 1):
        if i == len(natural) or natural[i] != natural[i - 1] + 1:
            offset = list(chunk.offsets)
            offset[dim] = natural[begin]
            pieces.append(local.narrow(dim, begin, i - begin))
            offsets.append(tuple(offset))
            begin = i
    return NaturalOrderShards(packed.shape, pieces, offsets)
