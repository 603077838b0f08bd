"""HF GPT-2, whose fused q|k|v ``c_attn`` is split ``colwise:3``, checkpointed under one TP size and
loaded under another: what the spawned ranks (and the single process) run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from brickwork.parallel import load_checkpoint, parallelize, save_checkpoint
from brickwork.train import TrainStep

VOCAB, DIM, SEQ, BATCH = 64, 32, 8, 4


def build(seed: int = 0) -> nn.Module:
    """GPT2LMHeadModel with 4 heads (so tp=4 splits them) and a tied head; ``seed`` sets its weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=2 * SEQ, n_embd=DIM, n_layer=2, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    return GPT2LMHeadModel(config)


def batches() -> tuple[torch.Tensor, torch.Tensor]:
    """[2, BATCH, SEQ] ids and their causal-LM labels (HF's: the ids): the step before the save and the
    one after."""
    ids = torch.randint(0, VOCAB, (2, BATCH, SEQ), generator=torch.Generator().manual_seed(11))
    return ids, ids.clone()


def logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids).logits
    return (out.full_tensor() if isinstance(out, DTensor) else out).detach().cpu()


def _after(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The logits on the second batch, then the loss of a step on it (which reads the AdamW state)."""
    ids, labels = batches()
    step = TrainStep(model, optimizer, "causal_lm")
    return {"logits": logits(model, ids[1]), "next_loss": step({"input_ids": ids[1], "labels": labels[1]})}


def save_run(root: str, layout: dict[str, Any]) -> dict[str, Any]:
    """One AdamW step under ``layout``, saved to root; then :func:`_after`."""
    model = parallelize(build(), layout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids, labels = batches()
    TrainStep(model, optimizer, "causal_lm")({"input_ids": ids[0], "labels": labels[0]})
    save_checkpoint(Path(root), model, optimizer, 1)
    return _after(model, optimizer)


def load_run(root: str, layout: dict[str, Any] | None) -> dict[str, Any]:
    """The checkpoint in root loaded under ``layout`` (None: a plain single-process model, not
    parallelized) into a model of other weights; then :func:`_after`."""
    model = build(seed=1)
    if layout is not None:
        model = parallelize(model, layout)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    load_checkpoint(Path(root), model, optimizer)
    return _after(model, optimizer)


def four_rank(root: str) -> dict[str, dict[str, Any]]:
    """The checkpoint in root loaded at tp=4, and at dp2×tp2 under ZeRO-3 (FSDP2 shards over the TP
    shards; every data-parallel rank takes the whole batch, so its step is the tp=2 run's)."""
    zero3 = {"data_parallel_size": 2, "tensor_parallel_size": 2, "zero_stage": 3}
    return {"tp4": load_run(root, {"tensor_parallel_size": 4}), "zero3": load_run(root, zero3)}
