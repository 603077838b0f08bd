"""Shared pieces of the distributed tests: tiny spec-built models, fixed data, the single-process
reference, and the functions each spawned rank runs (they must live in an importable module)."""

from __future__ import annotations

import copy
import functools
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor

from brickwork.errors import ConfigError
from brickwork.factory import build_model, get_preset
from brickwork.parallel import build_mesh, full_state_dict, parallel_state, parallelize, split_rows
from brickwork.train import TrainStep

VOCAB, DIM, SEQ, BATCH, STEPS = 64, 32, 8, 4, 3


def tiny_spec(kind: str) -> dict[str, Any]:
    """gpt: learned positions, fused qkv, GELU MLP, tied head. llama: rotary, GQA (4 q / 2 kv heads),
    SwiGLU, RMSNorm, untied head. 2 layers; "gpt4" / "llama4" have 4 (for interleaved pipelines)."""
    base = kind.rstrip("4")
    spec = copy.deepcopy(get_preset("gpt-tiny" if base == "gpt" else "llama"))
    spec.update(vocab_size=VOCAB, dim_model=DIM, max_seq_len=2 * SEQ)
    spec["decoder"]["num_layers"] = 4 if kind.endswith("4") else 2
    block = spec["decoder"]["block"]
    block["attention"]["num_heads"] = 4
    block["feedforward"]["hidden_dim"] = 64
    if base == "llama":
        block["attention"]["num_kv_heads"] = 2
    return spec


def build(kind: str, seed: int = 0) -> nn.Module:
    if kind == "gpt2-hf":
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(seed)
        config = GPT2Config(
            vocab_size=VOCAB, n_positions=2 * SEQ, n_embd=DIM, n_layer=2, n_head=4, bos_token_id=0,
            eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )  # fmt: skip
        return GPT2LMHeadModel(config)
    torch.manual_seed(seed)
    if kind == "toy":
        from toy_lm import ToyLM

        return ToyLM(vocab=VOCAB, dim=DIM, num_heads=4, num_layers=2, seq=2 * SEQ)
    if kind == "odd-heads":
        spec = tiny_spec("llama")
        spec["dim_model"] = 48
        spec["decoder"]["block"]["attention"].update(num_heads=6, num_kv_heads=3)
        return build_model(spec)
    return build_model(tiny_spec(kind))


def batches() -> tuple[torch.Tensor, torch.Tensor]:
    """[STEPS, BATCH, SEQ] token ids and their causal-LM labels (HF's: the ids; the model shifts them),
    the same in every process."""
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, VOCAB, (STEPS, BATCH, SEQ), generator=g)
    return ids, ids.clone()


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean causal-LM loss, HF's shift written out: logits [B, T, V] at position t against label t + 1."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())


def optimizer(params: Any, name: str) -> torch.optim.Optimizer:
    # SGD with momentum for the numerics: Adam divides by sqrt(v), which blows float noise in a
    # gradient that is zero in exact arithmetic (e.g. the key bias) up to a full lr-sized step.
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3)
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def logits_of(output: Any) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output.logits


def reference(kind: str, grad_clip: float | None = None) -> dict[str, Any]:
    """The single-process run: losses per step and the weights after STEPS steps."""
    model = build(kind)
    opt = optimizer(model.parameters(), "sgd")
    ids, labels = batches()
    with torch.no_grad():
        first_logits = logits_of(model(ids[0]))
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        loss = next_token_loss(logits_of(model(ids[step])), labels[step])
        loss.backward()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "state": model.state_dict(), "logits": first_logits}


def local_numel(tensor: torch.Tensor) -> int:
    return tensor.to_local().numel() if isinstance(tensor, DTensor) else tensor.numel()


def local_rows(model: nn.Module, tensors: tuple[torch.Tensor, ...], weights: Any = None) -> tuple:
    """This data-parallel rank's contiguous rows of each global-batch tensor (by ``weights`` if given)."""
    state = parallel_state(model)
    dp, rank = state.config.data_parallel_size, state.mesh["dp"].get_local_rank()
    rows = split_rows(tensors[0].shape[0], weights, dp)
    start = sum(rows[:rank])
    return tuple(t[start : start + rows[rank]] for t in tensors)


def lm_batch(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor, weights: Any = None) -> dict | None:
    """This rank's share as a batch dict; pipeline ranks past the first pass None (they receive it)."""
    state = parallel_state(model)
    if state.mesh["pp"].get_local_rank() > 0:
        return None
    local_ids, local_labels = local_rows(model, (ids, labels), weights)
    return {"input_ids": local_ids, "labels": local_labels}


def full_logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits = logits_of(model(ids.to(parallel_state(model).device)))
    return (logits.full_tensor() if isinstance(logits, DTensor) else logits).detach().cpu()


def run_layouts(cases: list[tuple[str, str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """On every rank: for each (key, model kind, dist dict), parallelize, train STEPS steps, report.

    The dist dict may carry test-only keys: ``optimizer`` ("sgd" | "adamw"), ``meta_init`` (rank 0
    builds the model, the others build it on the meta device), ``forward`` (also report the logits
    of ``model(ids[0])`` before training), ``grad_clip`` and ``precision`` (for the TrainStep).
    """
    out = {}
    ids, labels = batches()
    for key, kind, layout in cases:
        layout = dict(layout)
        opt_name = layout.pop("optimizer", "sgd")
        meta = layout.pop("meta_init", False)
        forward = layout.pop("forward", kind == "gpt2-hf")
        clip = layout.pop("grad_clip", None)
        precision = layout.pop("precision", "fp32")
        start = time.perf_counter()
        if meta and dist.get_rank() != 0:
            with torch.device("meta"):
                model = build(kind)
        else:
            model = build(kind)
        model = parallelize(model, layout)  # an HF GPT-2's plan comes from factory/hf/gpt2.py
        initial = full_state_dict(model) if meta else None
        params = list(model.parameters())
        opt = optimizer(params, opt_name)
        first_logits = full_logits(model, ids[0]) if forward else None
        step = TrainStep(model, opt, "causal_lm", grad_clip=clip, precision=precision)
        weights = layout.get("device_weights") if layout.get("pipeline_parallel_size", 1) == 1 else None
        losses = [step(lm_batch(model, ids[s], labels[s], weights)) for s in range(STEPS)]
        state_numel = sum(
            local_numel(v)
            for state in opt_state(parallel_state(model).stepped_optimizer(opt)).values()
            for v in state.values()
            if torch.is_tensor(v) and v.dim()
        )
        sharded = [
            p for p in params if isinstance(p, DTensor) and any(not q.is_replicate() for q in p.placements)
        ]
        out[key] = {
            "losses": losses,
            "state": full_state_dict(model),
            "initial": initial,
            "logits": first_logits,
            "local_numel": sum(local_numel(p) for p in params),
            "sharded_local_numel": sum(local_numel(p) for p in sharded),
            "sharded_numel": sum(p.numel() for p in sharded),
            "optimizer_state_numel": state_numel,
            "stages": [stage.stage_index for stage in getattr(model, "stages", [])],
            "stage_layers": [
                [int(i) for i in stage.layers._modules] for stage in getattr(model, "stages", [])
            ],
            "seconds": time.perf_counter() - start,
        }
    return out


def opt_state(opt: torch.optim.Optimizer) -> dict:
    """The optimizer state this rank holds (a ZeroRedundancyOptimizer's local shard of it)."""
    return opt.optim.state if isinstance(opt, ZeroRedundancyOptimizer) else opt.state


def mesh_groups(layouts: list[dict[str, Any]]) -> list[dict[str, list[int]]]:
    """This rank's groups along each mesh dim, for each layout."""
    result = []
    for layout in layouts:
        mesh = build_mesh(layout)
        result.append(
            {dim: dist.get_process_group_ranks(mesh[dim].get_group()) for dim in ("pp", "dp", "tp")}
        )
    return result


def bad_layouts(cases: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The ConfigError message each (model kind, bad dist dict) gives on this rank."""
    messages = []
    for kind, layout in cases:
        try:
            parallelize(build(kind), layout)
        except ConfigError as error:
            messages.append(str(error))
        else:
            messages.append("no error")
    return messages


def bad_layout_uncaught(kind: str, layout: dict[str, Any]) -> None:
    parallelize(build(kind), layout)


def bad_batches(kind: str, layout: dict[str, Any], rows: list[int]) -> list[str]:
    """The ValueError message of a train step on a batch of each of ``rows`` rows, on this rank."""
    model = parallelize(build(kind), layout)
    step = TrainStep(model, optimizer(model.parameters(), "sgd"), "causal_lm")
    messages = []
    for batch in rows:
        ids = torch.zeros(batch, SEQ, dtype=torch.long)
        try:
            step({"input_ids": ids, "labels": ids})
        except ValueError as error:
            messages.append(str(error))
        else:
            messages.append("no error")
    return messages


@functools.cache
def single_process(kind: str, grad_clip: float | None = None) -> dict:
    return reference(kind, grad_clip)


def check_against_reference(per_rank: list[dict], key: str, kind: str, grad_clip: float | None) -> None:
    ref = single_process(kind, grad_clip)
    got = per_rank[0][key]
    for rank_result in per_rank[1:]:
        assert rank_result[key]["losses"] == got["losses"], "ranks returned different losses"
    assert len(got["losses"]) == STEPS
    for step, (loss, want) in enumerate(zip(got["losses"], ref["losses"])):
        assert abs(loss - want) <= 1e-5 * abs(want), f"step {step}: loss {loss} vs one process {want}"
    assert got["state"].keys() == ref["state"].keys()
    for name, want in ref["state"].items():
        torch.testing.assert_close(
            got["state"][name], want, rtol=0, atol=1e-5, msg=f"{name} after {STEPS} steps"
        )
        rank_state = per_rank[-1][key]["state"][name]
        assert torch.equal(rank_state, got["state"][name]), f"{name}: full_state_dict differs between ranks"


def varying_batches(kind: str, layout: dict[str, Any], shapes: list[tuple[int, int]]) -> list[float]:
    """Losses of train steps on batches of the given [B, T] shapes, one after the other."""
    model = parallelize(build(kind), layout)
    step = TrainStep(model, optimizer(model.parameters(), "sgd"), "causal_lm")
    g = torch.Generator().manual_seed(5)
    losses = []
    for batch, seq in shapes:
        ids = torch.randint(0, VOCAB, (batch, seq), generator=g)
        losses.append(step(lm_batch(model, ids, ids)))
    return losses


def varying_batches_reference(kind: str, shapes: list[tuple[int, int]]) -> list[float]:
    model = build(kind)
    opt = optimizer(model.parameters(), "sgd")
    g = torch.Generator().manual_seed(5)
    losses = []
    for batch, seq in shapes:
        ids = torch.randint(0, VOCAB, (batch, seq), generator=g)
        opt.zero_grad()
        loss = next_token_loss(model(ids), ids)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
