"""Packed documents under tensor, pipeline and context parallel: what each spawned rank runs, and
the one-process reference."""

from __future__ import annotations

from typing import Any

import torch
from context_parallel_cases import build
from parallel_cases import VOCAB
from torch.distributed.tensor import DTensor

from brickwork.data.packing import packed_rows
from brickwork.parallel import full_state_dict, parallel_state, parallelize
from brickwork.train import TrainStep

END_ID, ROWS, LENGTH, STEPS = 0, 4, 16, 2


def packed_batches() -> list[dict[str, torch.Tensor]]:
    """STEPS batches of packed rows: random ids, about one in five the end-of-document id."""
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(1, VOCAB, (ROWS, LENGTH), generator=g)
        ids[torch.rand(ids.shape, generator=g) < 0.2] = END_ID
        out.append(packed_rows(ids, END_ID))
    return out


def train_packed(kind: str, dist: dict[str, int] | None) -> dict[str, Any]:
    """SGD on the packed batches (the dense document mask: a CPU backward), then the logits of the
    first batch in eval mode without gradients (FlexAttention's block mask), the full weights after.
    Under context parallel each rank runs its slice of the sequence, and the logits are gathered whole."""
    model = build(kind)
    if dist is not None:
        model = parallelize(model, dist)
    step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1), "causal_lm")
    losses = [step(batch) for batch in packed_batches()]
    model.eval()
    first = packed_batches()[0]
    cp = 1 if dist is None else dist.get("context_parallel_size", 1)
    if cp > 1:
        rank = parallel_state(model).mesh["cp"].get_local_rank()
        first = {k: v.chunk(cp, dim=1)[rank] for k, v in first.items()}
    with torch.no_grad():
        logits = model(first["input_ids"], document_ids=first["document_ids"])
    if isinstance(logits, DTensor):  # tensor parallel keeps the logits split over the vocabulary
        logits = logits.full_tensor()
    if cp > 1:
        group = parallel_state(model).mesh["cp"].get_group()
        slices = [torch.empty_like(logits) for _ in range(cp)]
        torch.distributed.all_gather(slices, logits.contiguous(), group=group)
        logits = torch.cat(slices, dim=1)
    return {"losses": losses, "logits": logits[..., :VOCAB], "state": full_state_dict(model)}


def run_layouts(cases: list[tuple[str, str, dict[str, int]]]) -> dict[str, dict[str, Any]]:
    """Each (name, kind, dist) case trained packed on this rank."""
    return {name: train_packed(kind, dist) for name, kind, dist in cases}
