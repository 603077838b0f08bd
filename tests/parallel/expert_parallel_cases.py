"""Expert-parallel test pieces: a tiny MoE decoder from a spec, fixed data, a plain torch training loop
written here as the reference, and the functions spawned ranks run (importable for spawn)."""

from __future__ import annotations

import copy
import re
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from brickwork.errors import ConfigError
from brickwork.factory import build_model, get_preset
from brickwork.parallel import full_state_dict, load_checkpoint, parallel_state, parallelize, save_checkpoint
from brickwork.train import TrainStep, evaluate

VOCAB, DIM, SEQ, ROWS, STEPS, EXPERTS = 48, 32, 8, 8, 3, 4


def spec(top_k: int) -> dict[str, Any]:
    """A 2-layer GPT whose feedforwards are mixtures of EXPERTS experts, ``top_k`` per token."""
    out = copy.deepcopy(get_preset("gpt-tiny"))
    out.update(vocab_size=VOCAB, dim_model=DIM, max_seq_len=2 * SEQ, dropout=0.0)
    out["decoder"]["num_layers"] = 2
    block = out["decoder"]["block"]
    block["attention"]["num_heads"] = 4
    block["attention"]["dropout"] = 0.0
    block["attention"].get("mechanism", {})["dropout"] = 0.0
    block["feedforward"] = {
        "name": "moe",
        "num_experts": EXPERTS,
        "top_k": top_k,
        "hidden_dim": 32,
        "aux_loss_weight": 0.1,
    }
    return out


def build(top_k: int = 2, starve: str | None = None) -> nn.Module:
    """``starve``: "upper-half" (top-1: experts 2 and 3 get no token), "last" (top-2: expert 3 none)."""
    torch.manual_seed(0)
    model = build_model(spec(top_k))
    if starve == "upper-half":
        starve_upper_half(model)
    elif starve == "last":
        starve_last(model)
    return model


@torch.no_grad()
def starve_upper_half(model: nn.Module) -> None:
    """Router rows of experts 2 and 3 := the mean of rows 0 and 1: their logits lie between those of 0
    and 1, so at top-1 neither ever wins a token. At ep=2 rank 1 then holds two experts that receive
    nothing from any rank (empty all-to-all parts) before training moves the router."""
    for module in model.modules():
        router = getattr(module, "router", None)
        if router is not None:
            router.weight[2:] = (router.weight[0] + router.weight[1]) / 2


@torch.no_grad()
def starve_last(model: nn.Module) -> None:
    """A router bias, which a linear router lacks, made from the MoE's input: feature 0 of the
    feedforward norm's output := 1 for every token (weight 0, bias 1), and expert 3's router row :=
    -100 on that feature only. Its logit is then -100 while the others' are O(1), so even at top-2 it
    gets no token for as long as training leaves that feature near 1 (the 3 steps here)."""
    for layer in model.layers:
        layer.feedforward_norm.weight[0] = 0.0
        layer.feedforward_norm.bias[0] = 1.0
        router = layer.feedforward.router.weight
        router[3] = 0.0
        router[3, 0] = -100.0


def global_batches() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(0, VOCAB, (ROWS, SEQ), generator=g)
        out.append({"input_ids": ids, "labels": ids.clone()})  # HF's causal-LM labels: shifted inside
    return out


def moe_aux(model: nn.Module) -> torch.Tensor:
    return sum(m.aux_loss_weight * m.aux_loss for m in model.modules() if hasattr(m, "aux_loss_weight"))


def reference(top_k: int, starve: str | None, parts: int, grad_clip: float | None = None) -> dict[str, Any]:
    """One process, plain torch: mean cross-entropy of each global batch plus, as each of ``parts``
    data-parallel ranks computes it on its rows, the load-balancing loss weighted by its positions; SGD."""
    model = build(top_k, starve)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for batch in global_batches():
        opt.zero_grad()
        count = batch["labels"][:, 1:].numel()  # position t scores label t + 1: the last scores nothing
        total, ce_sum = torch.zeros(()), torch.zeros(())
        for i in range(parts):
            ids, labels = batch["input_ids"].chunk(parts)[i], batch["labels"].chunk(parts)[i][:, 1:]
            ce = F.cross_entropy(model(ids)[:, :-1].flatten(0, 1), labels.flatten(), reduction="sum")
            ce_sum = ce_sum + ce.detach()
            total = total + ce + moe_aux(model) * labels.numel()
        (total / count).backward()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        losses.append(float(ce_sum / count))
    with torch.no_grad():
        first = global_batches()[0]
        logits = model(first["input_ids"])[:, :-1]
        held_out = F.cross_entropy(logits.flatten(0, 1), first["labels"][:, 1:].flatten())
    state = {k: v.detach().clone() for k, v in full_state_dict(model).items()}  # the real vocabulary
    return {"losses": losses, "state": state, "eval": float(held_out)}


def share(model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    state = parallel_state(model)
    dp, rank = state.config.data_parallel_size, state.mesh["dp"].get_local_rank()
    return {k: v.chunk(dp)[rank] for k, v in batch.items()}


def train(layout: dict[str, Any]) -> tuple[nn.Module, dict[str, Any], TrainStep, torch.optim.Optimizer]:
    """Parallelize and take STEPS TrainSteps; test-only keys: top_k, starve, and the TrainStep's
    grad_clip, grad_accum_steps and precision."""
    layout = dict(layout)
    top_k, starve = layout.pop("top_k", 2), layout.pop("starve", None)
    options = {k: layout.pop(k) for k in ("grad_clip", "grad_accum_steps", "precision") if k in layout}
    model = parallelize(build(top_k, starve), layout)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = TrainStep(model, opt, "causal_lm", **options)
    losses, counts = [], []
    for batch in global_batches():
        losses.append(step(share(model, batch)))
        counts.append(step.metrics["expert_counts"])
    held = {int(m[1]) for n, _ in model.named_parameters() if (m := re.search(r"\.experts\.(\d+)\.", n))}
    report = {
        "losses": losses,
        "eval": evaluate(model, [share(model, global_batches()[0])], "causal_lm"),
        "state": full_state_dict(model),
        "expert_counts": counts,
        "held_experts": sorted(held),
    }
    return model, report, step, opt


def logits(model: nn.Module) -> torch.Tensor:
    with torch.no_grad():
        out = model(global_batches()[0]["input_ids"])
    return out.full_tensor() if hasattr(out, "full_tensor") else out


def checkpoint_round_trip(directory: str) -> dict[str, Any]:
    """Train at ep=2 under ZeRO-1 and save (weights and SGD momentum); reload into fresh models at ep=2
    (ZeRO-1 and ZeRO-0) and at ep=1 (dp2): the logits of each, and the losses of two more steps from
    each, beside the uninterrupted run's."""
    ep2 = {"data_parallel_size": 2, "expert_parallel_size": 2}
    model, _, step, opt = train({**ep2, "zero_stage": 1})
    save_checkpoint(directory, model, opt, step=STEPS)
    # Two more steps: the second one's loss shows the first update, which used the momentum saved.
    extra = global_batches()[1:]
    out = {"saved": logits(model), "next_loss": [step(share(model, b)) for b in extra]}
    reloads = {"ep2-zero1": {**ep2, "zero_stage": 1}, "ep2": ep2, "ep1": {"data_parallel_size": 2}}
    for name, layout in reloads.items():
        fresh = parallelize(build(), layout)
        opt = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
        resumed = TrainStep(fresh, opt, "causal_lm")
        load_checkpoint(directory, fresh, opt)
        out[name] = logits(fresh)
        out[f"{name}_next_loss"] = [resumed(share(fresh, b)) for b in extra]
    return out


def run_world(cases: list[tuple[str, dict[str, Any]]], directory: str | None) -> dict[str, Any]:
    """Everything one spawned world checks: each layout trained, and with ``directory`` the checkpoint."""
    out: dict[str, Any] = {}
    for key, layout in cases:
        out[key] = train(layout)[1]
        dist.barrier()
    if directory is not None:
        out["checkpoint"] = checkpoint_round_trip(directory)
        out["meta_init"] = meta_init_message()
    return out


def meta_init_message() -> str:
    """Rank 0 passes the real model, the others a meta one, at ep=2: the error each rank gets."""
    if dist.get_rank() == 0:
        model = build()
    else:
        with torch.device("meta"):
            model = build()
    try:
        parallelize(model, {"data_parallel_size": 2, "expert_parallel_size": 2})
    except ConfigError as error:
        return str(error)
    return "no error"
