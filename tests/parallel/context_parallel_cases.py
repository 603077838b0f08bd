"""Pieces of the context-parallel tests: tiny models with each kind of position, the single-process
reference, and what each spawned rank runs (layouts trained, refusals, mesh groups) in one world."""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch
import torch.distributed as dist
from parallel_cases import SEQ, STEPS, VOCAB, batches, lm_batch, next_token_loss, optimizer, tiny_spec
from torch import nn
from torch.distributed.tensor import DTensor

from brickwork.factory import build_model, get_preset
from brickwork.parallel import build_mesh, full_state_dict, parallel_state, parallelize, save_checkpoint
from brickwork.parallel.mesh import data_mesh
from brickwork.train import TrainStep, evaluate


def build(kind: str, seed: int = 0) -> nn.Module:
    """Decoder LMs: "llama" (rotary, GQA), "gpt" (learned, fused qkv), "sine", "alibi" (the gpt spec
    with that position); "encoder": a bidirectional BERT-style encoder with learned positions."""
    if kind in ("gpt", "llama"):
        spec = tiny_spec(kind)
    elif kind == "encoder":
        spec = copy.deepcopy(get_preset("bert-base"))
        spec.update(vocab_size=VOCAB, dim_model=32, max_seq_len=2 * SEQ, dropout=0.0)
        spec["encoder"]["num_layers"] = 2
        block = spec["encoder"]["block"]
        block["attention"].update(num_heads=4, dropout=0.0, mechanism={"name": "scaled_dot_product"})
        block["feedforward"].update(hidden_dim=64, dropout=0.0)
    else:
        spec = tiny_spec("gpt")
        spec["position"] = {"name": kind}
    torch.manual_seed(seed)
    return build_model(spec)


def reference(kind: str) -> dict[str, Any]:
    """One process: the first batch's logits, the losses of STEPS steps, the weights after and the
    first batch's loss with them."""
    model = build(kind)
    opt = optimizer(model.parameters(), "sgd")
    ids, labels = batches()
    with torch.no_grad():
        logits = model(ids[0])
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        loss = next_token_loss(model(ids[step]), labels[step])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        final = next_token_loss(model(ids[0]), labels[0]).item()
    return {"logits": logits, "losses": losses, "eval": final, "state": model.state_dict()}


@functools.cache
def single_process(kind: str) -> dict[str, Any]:
    return reference(kind)


def local_logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """``model`` on this cp rank's slice of every sequence of ``ids`` (all rows)."""
    state = parallel_state(model)
    cp, rank = state.config.context_parallel_size, state.mesh["cp"].get_local_rank()
    with torch.no_grad():
        out = model(ids.chunk(cp, dim=1)[rank])
    return out.full_tensor() if isinstance(out, DTensor) else out


def train(kind: str, layout: dict[str, Any]) -> dict[str, Any]:
    """Parallelize, report the first batch's local logits, train STEPS steps (cp rank 1 passes None
    to receive the batch), and report the losses, an evaluation and the gathered weights. A test-only
    key ``save_to`` names a folder to save a checkpoint in after training."""
    layout = dict(layout)
    save_to = layout.pop("save_to", None)
    model = parallelize(build(kind), layout)
    ids, labels = batches()
    logits = local_logits(model, ids[0])
    opt = optimizer(model.parameters(), "sgd")
    step = TrainStep(model, opt, "causal_lm")
    cp_rank = parallel_state(model).mesh["cp"].get_local_rank()

    def batch(s: int) -> dict | None:
        return lm_batch(model, ids[s], labels[s]) if cp_rank == 0 else None

    losses = [step(batch(s)) for s in range(STEPS)]
    if save_to is not None:
        save_checkpoint(save_to, model, opt, STEPS)
    return {
        "cp_rank": cp_rank,
        "logits": logits,
        "losses": losses,
        "eval": evaluate(model, [batch(0)], "causal_lm"),
        "state": full_state_dict(model),
    }


def refusals() -> list[str]:
    """The error of each thing context parallel refuses at run time, on this rank of a cp=2 world."""
    model = parallelize(build("llama"), {"context_parallel_size": 2})
    step = TrainStep(model, optimizer(model.parameters(), "sgd"), "causal_lm")
    ids = torch.zeros(2, SEQ, dtype=torch.long)
    padded = torch.ones_like(ids)
    padded[0, -1] = 0
    long = torch.zeros(2, 2 * SEQ + 2, dtype=torch.long)  # each slice fits max_seq_len, the whole does not
    attempts = {
        "odd length": lambda: step({"input_ids": ids[:, :-1], "labels": ids[:, :-1]}),
        "padding": lambda: step({"input_ids": ids, "labels": ids, "attention_mask": padded}),
        "direct mask": lambda: model(ids[:, : SEQ // 2], attention_mask=padded[:, : SEQ // 2]),
        "kv cache": lambda: model.generate(ids[:, : SEQ // 2], 1),
        "too long": lambda: step({"input_ids": long, "labels": long}),
    }
    messages = []
    for attempt in attempts.values():
        try:
            attempt()
        except ValueError as error:
            messages.append(str(error))
        else:
            messages.append("no error")
    # An all-ones mask says nothing: it is left out, and the step trains as without it.
    messages.append(str(step({"input_ids": ids, "labels": ids, "attention_mask": torch.ones_like(ids)})))
    return messages


def mesh_groups(layouts: list[dict[str, Any]]) -> list[dict[str, list[int]]]:
    """This rank's groups along each mesh dim and over data replicas (dp × cp), for each layout."""
    result = []
    for layout in layouts:
        mesh = build_mesh(layout)
        groups = {dim: dist.get_process_group_ranks(mesh[dim].get_group()) for dim in mesh.mesh_dim_names}
        groups["replicas"] = dist.get_process_group_ranks(data_mesh(mesh).get_group())
        result.append(groups)
    return result


def run_world(
    cases: list[tuple[str, str, dict[str, Any]]], runtime_refusals: bool, mesh_layouts: list[dict[str, Any]]
) -> dict[str, Any]:
    """On every rank of one spawned world: each (key, kind, layout) trained, then the refusals and
    the mesh groups of ``mesh_layouts``."""
    out: dict[str, Any] = {key: train(kind, layout) for key, kind, layout in cases}
    if runtime_refusals:
        out["refusals"] = refusals()
    out["mesh_groups"] = mesh_groups(mesh_layouts)
    return out
