"""The data contract of a train step: batches as dicts of tensors with HF's key names.

Each data-parallel rank passes its own share. Tensor- and pipeline-parallel peers (one
data-parallel index) must train on one batch: the group's first rank passes it, and every peer
either passes ``None`` and receives it by broadcast, as in Megatron, or passes its own copy, which is
checked against the first rank's by a position-weighted checksum (one small all-gather), so a
mismatch raises on every rank instead of silently giving a wrong loss. Context-parallel peers share
the batch the same way, then each takes its slice of the sequences (``shard_sequence``).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import torch
import torch.distributed as dist

from brickwork.parallel import ParallelState
from brickwork.parallel.context_parallel import sequence_shard

Batch = dict[str, torch.Tensor]
# The batch keys holding one entry per position of the sequence, which context parallel splits (a
# causal LM's labels are shifted into shift_labels first: brickwork/train/tasks/causal_lm.py; packed
# documents' ids are gathered back whole inside the model: parallel/context_parallel.py).
SEQUENCE_KEYS = ("input_ids", "labels", "shift_labels", "attention_mask", "token_type_ids", "document_ids")


def check_batch(batch: object) -> Batch:
    """``batch`` as a dict of tensors; TypeError naming what was passed otherwise."""
    if not isinstance(batch, Mapping) or not all(isinstance(v, torch.Tensor) for v in batch.values()):
        raise TypeError(
            "a batch is a dict of tensors with HF's key names (input_ids, attention_mask, labels, "
            f"decoder_input_ids, pixel_values, ...), got {type(batch).__name__}"
        )
    return dict(batch)


def _checksum(batch: Batch | None, device: torch.device) -> torch.Tensor:
    """[has batch, crc of keys/shapes/dtypes, weighted sum, plain sum] as float64."""
    out = torch.zeros(4, dtype=torch.float64, device=device)
    if batch is None:
        return out
    header = repr([(k, tuple(v.shape), str(v.dtype)) for k, v in sorted(batch.items())])
    out[0], out[1] = 1, zlib.crc32(header.encode())
    for value in batch.values():
        flat = value.detach().flatten().to(device, torch.float64)
        weights = torch.arange(flat.numel(), device=device, dtype=torch.float64).remainder_(9973).add_(1)
        out[2] += (flat * weights).sum()
        out[3] += flat.sum()
    return out


def _to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``. A CPU batch bound for CUDA goes through pinned memory without waiting:
    a copy from pageable memory would first wait for every kernel already queued (the previous
    step's optimizer), leaving the GPU idle while the host queues the next forward pass."""
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def share_batch(batch: object | None, state: ParallelState | None, device: torch.device) -> Batch:
    """This rank's batch on ``device``, agreed within its tensor/pipeline-parallel group.

    ValueError on every rank of the group when the first rank passed None, or when a peer passed a
    batch different from the first rank's.
    """
    group = state.batch_group if state is not None else None
    if group is None:
        if batch is None:
            raise ValueError(
                "batch is None, but this rank has no tensor/pipeline-parallel peer to take it from"
            )
        return {k: _to_device(v, device) for k, v in check_batch(batch).items()}
    own = check_batch(batch) if batch is not None else None
    ranks = dist.get_process_group_ranks(group)
    sums = [torch.zeros(4, dtype=torch.float64, device=device) for _ in ranks]
    dist.all_gather(sums, _checksum(own, device), group=group)
    source = sums[0]
    if not source[0]:
        raise ValueError(
            f"rank {ranks[0]}, the first of the tensor/pipeline-parallel group {ranks}, passed no batch; "
            "it is the one the others receive from"
        )
    differ = [r for r, s in zip(ranks, sums) if s[0] and not torch.equal(s, source)]
    if differ:
        raise ValueError(
            f"ranks {differ} passed a batch different from rank {ranks[0]}'s, the first of their "
            f"tensor/pipeline-parallel group {ranks}: these peers must train on the same batch (pass "
            "the same one, or None to receive it)"
        )
    if all(s[0] for s in sums):
        return {k: v.to(device) for k, v in own.items()}
    header = [[(k, tuple(v.shape), v.dtype) for k, v in own.items()] if own is not None else None]
    dist.broadcast_object_list(header, group=group, group_src=0)
    shared = {}
    for key, shape, dtype in header[0]:
        tensor = own[key].to(device) if own is not None else torch.empty(shape, dtype=dtype, device=device)
        dist.broadcast(tensor, group=group, group_src=0)
        shared[key] = tensor
    return shared


def shard_sequence(batch: Batch, state: ParallelState | None) -> Batch:
    """Under context parallel, this rank's contiguous slice of every sequence, [B, T] -> [B, T / cp]
    (the batch as it is otherwise). An all-ones ``attention_mask`` says nothing and is left out; a
    batch with padding, or with a key that is not a token sequence, raises ValueError naming it."""
    if state is None or state.config.context_parallel_size == 1:
        return batch
    out = {}
    for key, value in batch.items():
        if key not in SEQUENCE_KEYS:
            raise ValueError(
                f"context parallel splits token sequences ({list(SEQUENCE_KEYS)}); the batch key {key!r} "
                "is not one"
            )
        if key == "attention_mask":
            if not bool(value.all()):
                raise ValueError(
                    "context parallel takes whole, unpadded sequences, but attention_mask marks padding; "
                    "pack the sequences or run without context_parallel_size"
                )
            continue
        out[key] = sequence_shard(value, state.mesh["cp"], key)
    return out


def split_batch(batch: Batch, parts: int) -> list[Batch]:
    """``parts`` equal micro-batches along dim 0; ValueError naming the sizes when rows do not divide."""
    rows = {v.shape[0] for v in batch.values() if v.dim()}
    if len(rows) != 1:
        raise ValueError(f"every tensor of a batch must have the same number of rows, got {sorted(rows)}")
    (count,) = rows
    if count % parts:
        raise ValueError(
            f"a batch of {count} rows does not split into grad_accum_steps={parts} micro-batches"
        )
    return [{k: v.chunk(parts)[i] for k, v in batch.items()} for i in range(parts)]
