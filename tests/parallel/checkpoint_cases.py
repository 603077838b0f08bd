"""What spawned ranks run in the checkpoint tests: train and save under one layout, load and go on
under another, and a save killed just before its marker."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from parallel_cases import SEQ, VOCAB, build, full_logits, lm_batch, next_token_loss

import brickwork.parallel.checkpoint.save_load as checkpoint_module
from brickwork.parallel import load_checkpoint, parallelize, save_checkpoint
from brickwork.train import TrainStep

TOTAL_STEPS, SAVE_AT = 4, 2


def batches() -> tuple[torch.Tensor, torch.Tensor]:
    """[TOTAL_STEPS, 4, SEQ] token ids and their causal-LM labels (HF's: the ids), the same in every
    process."""
    g = torch.Generator().manual_seed(99)
    ids = torch.randint(0, VOCAB, (TOTAL_STEPS, 4, SEQ), generator=g)
    return ids, ids.clone()


def make_optimizer(params: Any, name: str) -> torch.optim.Optimizer:
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-2, betas=(0.8, 0.9))
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def uninterrupted(kind: str, opt_name: str) -> list[float]:
    """One process, TOTAL_STEPS steps without a break: the losses a resumed run must reproduce."""
    model = build(kind)
    opt = make_optimizer(model.parameters(), opt_name)
    ids, labels = batches()
    losses = []
    for step in range(TOTAL_STEPS):
        opt.zero_grad()
        loss = next_token_loss(model(ids[step]), labels[step])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def train_and_save(root: str, cases: list[tuple[str, str, dict[str, Any], str]]) -> dict[str, Any]:
    """Train SAVE_AT steps under each layout, save to root/key; report losses and the logits then."""
    ids, labels = batches()
    out = {}
    for key, kind, layout, opt_name in cases:
        model = parallelize(build(kind), layout)
        opt = make_optimizer(model.parameters(), opt_name)
        step = TrainStep(model, opt, "causal_lm")
        losses = [step(lm_batch(model, ids[s], labels[s])) for s in range(SAVE_AT)]
        save_checkpoint(Path(root) / key, model, opt, SAVE_AT, extra={"key": key})
        out[key] = {"losses": losses, "logits": full_logits(model, ids[0])}
    return out


def load_and_resume(root: str, cases: list[tuple[str, str, str, dict[str, Any], str]]) -> dict[str, Any]:
    """For each (result key, folder, kind, layout, optimizer): build the model from another seed,
    load root/folder under this layout and train to TOTAL_STEPS."""
    ids, labels = batches()
    out = {}
    for key, folder, kind, layout, opt_name in cases:
        model = parallelize(build(kind, seed=7), layout)
        opt = make_optimizer(model.parameters(), opt_name)
        meta = load_checkpoint(Path(root) / folder, model, opt)
        step = TrainStep(model, opt, "causal_lm")
        losses = [step(lm_batch(model, ids[s], labels[s])) for s in range(meta["step"], TOTAL_STEPS)]
        out[key] = {"losses": losses, "meta": meta}
    return out


def resume_in_one_process(
    folder: Path, kind: str, opt_name: str, stop_at: int = TOTAL_STEPS, save_to: Path | None = None
) -> tuple[list[float], dict[str, Any]]:
    """The same on a plain model without any process group, up to ``stop_at``; then saved to
    ``save_to`` if given."""
    model = build(kind, seed=7)
    opt = make_optimizer(model.parameters(), opt_name)
    meta = load_checkpoint(folder, model, opt)
    ids, labels = batches()
    losses = []
    for step in range(meta["step"], stop_at):
        opt.zero_grad()
        loss = next_token_loss(model(ids[step]), labels[step])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if save_to is not None:
        save_checkpoint(save_to, model, opt, stop_at)
    return losses, meta


def save_killed_before_marker(folder: str, kind: str, layout: dict[str, Any]) -> None:
    """Save over ``folder``; rank 0 dies (os._exit, no cleanup) right before writing the marker."""
    model = parallelize(build(kind), layout)
    opt = make_optimizer(model.parameters(), "sgd")
    ids, labels = batches()
    TrainStep(model, opt, "causal_lm")(lm_batch(model, ids[0], labels[0]))
    if dist.get_rank() == 0:
        checkpoint_module.mark_complete = lambda path: os._exit(1)
    save_checkpoint(folder, model, opt, 1)
