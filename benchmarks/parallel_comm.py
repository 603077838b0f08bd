"""Communication and memory of one training step under tp=2, ZeRO-3 (dp=2) and expert parallel
(dp=2, ep=2), on CPU/gloo.

Run ``python -m benchmarks.parallel_comm`` (or ``python benchmarks/parallel_comm.py``). Two processes
train a spec-built GPT; a dispatch mode records every collective the step issues (DTensor's
functional collectives and FSDP's c10d calls alike) with the size of the full buffer it works on:
the tensor for all-reduce and broadcast, the gathered output for all-gather, the input for
reduce-scatter; for an all-to-all, the rows of its input bound for other ranks. The table compares
them with the analytical minimum:

- Megatron TP: per layer, 2 all-reduces of B·T·d in forward (attention and MLP outputs) and 2 in
  backward (their inputs' gradients); a vocab-parallel embedding and LM head add one each.
- ZeRO-3: every parameter is all-gathered for forward and again for backward, and every gradient
  reduce-scattered once: 3 × the parameter bytes.
- Expert parallel (the GPT with 4-expert top-2 MoE feedforwards, experts split over the 2 ranks):
  per MoE layer, forward sends the token rows routed to the other rank's experts (dispatch) and
  returns the rows the other rank sent here (combine); backward sends the gradients of both back.
  So 2 × (rows sent off-rank + rows received) × d × 4 bytes, from this step's own routing (the
  per-expert token counts, also in the table). The per-rank count exchange before each dispatch
  (E int64s) is listed apart as "all-to-all counts". The data-parallel all-reduce covers every
  gradient but the experts' (each expert is on one rank at dp = ep = 2).
"""

from __future__ import annotations

import argparse
import copy
import json
from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from brickwork.components.feedforward.moe import MixtureOfExperts
from brickwork.factory import build_model, get_preset
from brickwork.parallel import parallel_state, parallelize, spawn
from brickwork.train import TrainStep

LAYERS, DIM, HEADS, VOCAB, BATCH, SEQ = 2, 64, 4, 128, 4, 16
MODEL_PLAN = {
    "token_embedding": "vocab",
    "lm_head": "colwise",
    "layers.*.attention_norm": "sequence_parallel",
    "layers.*.feedforward_norm": "sequence_parallel",
    "final_norm": "sequence_parallel",
}

_KINDS = {
    "all_reduce": "all-reduce",
    "allreduce_": "all-reduce",
    "all_gather_into_tensor": "all-gather",
    "_allgather_base_": "all-gather",
    "allgather_": "all-gather",
    "reduce_scatter_tensor": "reduce-scatter",
    "_reduce_scatter_base_": "reduce-scatter",
    "reduce_scatter_": "reduce-scatter",
    "broadcast_": "broadcast",
    "all_to_all_single": "all-to-all",
    "alltoall_base_": "all-to-all counts",
}
EXPERTS, TOP_K = 4, 2


class CollectiveBytes(TorchDispatchMode):
    """Counts collectives and the bytes of the full buffer each one works on."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = defaultdict(int)
        self.bytes: dict[str, int] = defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(issubclass(t, DTensor) for t in types):
            # Let DTensor run the op with this mode still active, so the collectives it issues
            # inside (e.g. loss-parallel cross entropy) are counted too.
            return NotImplemented
        name = func._overloadpacket.__name__
        kind = _KINDS.get(name) if func.namespace in ("c10d", "_c10d_functional") else None
        if kind is not None:
            self.calls[kind] += 1
            self.bytes[kind] += _full_bytes(name, args)
        return func(*args, **(kwargs or {}))


def _bytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    return sum(_bytes(item) for item in x) if isinstance(x, list | tuple) else 0


def _full_bytes(name: str, args: tuple) -> int:
    if name == "all_to_all_single":  # functional: (input, output_splits, input_splits, group_name)
        # The ep group is the whole (2-rank) world here, so this rank's index in it is its rank.
        rows, mine = args[0].shape[0], int(args[2][dist.get_rank()])
        return _bytes(args[0]) * (rows - mine) // max(rows, 1)
    if name == "all_gather_into_tensor":  # functional: (input, group_size, group_name)
        return _bytes(args[0]) * int(args[1])
    if name in ("_reduce_scatter_base_", "reduce_scatter_"):  # c10d: (output(s), input(s), ...)
        return _bytes(args[1])
    # all-reduce and broadcast: the tensor(s); c10d all-gather: (output(s), input(s)); functional
    # reduce-scatter: (input, ...).
    return _bytes(args[0])


def spec(moe: bool = False) -> dict[str, Any]:
    s = copy.deepcopy(get_preset("gpt-tiny"))
    s.update(vocab_size=VOCAB, dim_model=DIM, max_seq_len=SEQ)
    s["decoder"]["num_layers"] = LAYERS
    s["decoder"]["block"]["attention"]["num_heads"] = HEADS
    s["decoder"]["block"]["feedforward"]["hidden_dim"] = 4 * DIM
    if moe:
        s["decoder"]["block"]["feedforward"] = {
            "name": "moe",
            "num_experts": EXPERTS,
            "top_k": TOP_K,
            "hidden_dim": 4 * DIM,
        }
    return s


def _local_bytes(tensors: Any) -> int:
    return sum((t.to_local() if isinstance(t, DTensor) else t).numel() * t.element_size() for t in tensors)


def measure(layout: dict[str, Any]) -> dict[str, Any]:
    """On each rank: one warm-up step, then one counted step; returns counts, bytes and memory."""
    torch.manual_seed(0)
    ep = layout.get("expert_parallel_size", 1) > 1
    model = build_model(spec(moe=ep))
    total_param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    expert_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".experts." in n)
    tp = layout.get("tensor_parallel_size", 1) > 1
    pm = parallelize(model, layout, plan=MODEL_PLAN if tp else None)
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    step = TrainStep(pm, opt, "causal_lm")
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    dp_mesh = parallel_state(pm).mesh["dp"]
    rows = BATCH // dp_mesh.size()
    ids = ids[dp_mesh.get_local_rank() * rows :][:rows]  # this data-parallel rank's share
    batch = {"input_ids": ids, "labels": ids}  # HF's causal-LM labels: shifted inside
    step(batch)
    with CollectiveBytes() as counter:
        step(batch)
    states = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
    routing = _routing(pm, step.metrics["expert_counts"]) if ep else {}
    return {
        **routing,
        "calls": dict(counter.calls),
        "bytes": dict(counter.bytes),
        "param_bytes": _local_bytes(pm.parameters()),
        "optimizer_bytes": _local_bytes(states),
        "total_param_bytes": total_param_bytes,
        "expert_param_bytes": expert_bytes,
        "rank": dist.get_rank(),
    }


def _routing(model: torch.nn.Module, global_counts: list[list[int]]) -> dict[str, Any]:
    """Per-expert token counts of the counted step (global batch) and the analytical all-to-all bytes
    this rank sends: 2 × (rows to other ranks' experts + rows from other ranks to its own) × d × 4."""
    rows = 0
    layers = [m for m in model.modules() if isinstance(m, MixtureOfExperts)]
    for moe, total in zip(layers, global_counts, strict=True):
        held = moe.experts.indices()
        mine = moe.expert_counts.tolist()
        rows += sum(c for e, c in enumerate(mine) if e not in held)
        rows += sum(total[e] - mine[e] for e in held)
    return {"expert_counts": global_counts, "all_to_all_minimum": 2 * rows * DIM * 4}


def theory(layout_name: str, r: dict[str, Any]) -> dict[str, int]:
    activation = BATCH * SEQ * DIM * 4
    total_param_bytes = r["total_param_bytes"]
    if "all_to_all_minimum" in r:
        # DDP all-reduces every gradient but the experts'; each expert lives on one rank here.
        dense = total_param_bytes - r["expert_param_bytes"]
        return {"all-to-all": r["all_to_all_minimum"], "all-reduce": dense}
    if layout_name == "tp2":
        # 4 per layer (2 forward, 2 backward) + embedding forward + LM-head input gradient.
        return {"all-reduce": (4 * LAYERS + 2) * activation}
    return {"all-gather": 2 * total_param_bytes, "reduce-scatter": total_param_bytes}


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        f"GPT from the gpt-tiny preset, {LAYERS} layers, d={DIM}, vocab={VOCAB}, B={BATCH}, T={SEQ}, fp32, "
        "2 processes (gloo); one training step with AdamW, rank 0. ep2: the same GPT with "
        f"{EXPERTS}-expert top-{TOP_K} MoE feedforwards, dp=2, ep=2.",
        "",
        "| layout | collective | calls | bytes measured | analytical minimum |",
        "|---|---|---|---|---|",
    ]
    for name, r in results.items():
        minimum = theory(name, r)
        for kind in sorted(set(r["bytes"]) | set(minimum)):
            lines.append(
                f"| {name} | {kind} | {r['calls'].get(kind, 0)} | {r['bytes'].get(kind, 0):,} | "
                f"{minimum.get(kind, 0):,} |"
            )
    lines += ["", "| layout | parameter bytes / rank | optimizer bytes / rank | full model parameter bytes |"]
    lines.append("|---|---|---|---|")
    for name, r in results.items():
        row = (name, f"{r['param_bytes']:,}", f"{r['optimizer_bytes']:,}", f"{r['total_param_bytes']:,}")
        lines.append("| " + " | ".join(row) + " |")
    for name, r in results.items():
        if "expert_counts" in r:
            lines += ["", f"{name}: tokens per expert in the counted step (global batch), per MoE layer:"]
            lines += [f"- layer {i}: {counts}" for i, counts in enumerate(r["expert_counts"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the raw numbers to this file")
    args = parser.parse_args(argv)
    layouts = {
        "tp2": {"tensor_parallel_size": 2},
        "zero3-dp2": {"data_parallel_size": 2, "zero_stage": 3},
        "ep2": {"data_parallel_size": 2, "expert_parallel_size": 2},
    }
    results = {}
    for name, layout in layouts.items():
        print(f"measuring {name} ...", flush=True)
        results[name] = spawn(measure, 2, layout, timeout=300)[0]
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
