"""Communication and memory of one training step under tp=2 and under ZeRO-3 (dp=2), on CPU/gloo.

Run ``python -m benchmarks.parallel_comm`` (or ``python benchmarks/parallel_comm.py``). Two processes
train a spec-built GPT; a dispatch mode records every collective the step issues (DTensor's
functional collectives and FSDP's c10d calls alike) with the size of the full buffer it works on:
the tensor for all-reduce and broadcast, the gathered output for all-gather, the input for
reduce-scatter. The table compares them with the analytical minimum:

- Megatron TP: per layer, 2 all-reduces of B·T·d in forward (attention and MLP outputs) and 2 in
  backward (their inputs' gradients); a vocab-parallel embedding and LM head add one each.
- ZeRO-3: every parameter is all-gathered for forward and again for backward, and every gradient
  reduce-scattered once: 3 × the parameter bytes.
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
}


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
    if name == "all_gather_into_tensor":  # functional: (input, group_size, group_name)
        return _bytes(args[0]) * int(args[1])
    if name in ("_reduce_scatter_base_", "reduce_scatter_"):  # c10d: (output(s), input(s), ...)
        return _bytes(args[1])
    # all-reduce and broadcast: the tensor(s); c10d all-gather: (output(s), input(s)); functional
    # reduce-scatter: (input, ...).
    return _bytes(args[0])


def spec() -> dict[str, Any]:
    s = copy.deepcopy(get_preset("gpt-tiny"))
    s.update(vocab_size=VOCAB, dim_model=DIM, max_seq_len=SEQ)
    s["decoder"]["num_layers"] = LAYERS
    s["decoder"]["block"]["attention"]["num_heads"] = HEADS
    s["decoder"]["block"]["feedforward"]["hidden_dim"] = 4 * DIM
    return s


def _local_bytes(tensors: Any) -> int:
    return sum((t.to_local() if isinstance(t, DTensor) else t).numel() * t.element_size() for t in tensors)


def measure(layout: dict[str, Any]) -> dict[str, Any]:
    """On each rank: one warm-up step, then one counted step; returns counts, bytes and memory."""
    torch.manual_seed(0)
    model = build_model(spec())
    total_param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    tp = layout.get("tensor_parallel_size", 1) > 1
    pm = parallelize(model, layout, plan=MODEL_PLAN if tp else None)
    opt = torch.optim.AdamW(pm.parameters(), lr=1e-3)
    step = TrainStep(pm, opt, "causal_lm")
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    dp_mesh = parallel_state(pm).mesh["dp"]
    rows = BATCH // dp_mesh.size()
    ids = ids[dp_mesh.get_local_rank() * rows :][:rows]  # this data-parallel rank's share
    batch = {"input_ids": ids, "labels": torch.roll(ids, -1, dims=1)}
    step(batch)
    with CollectiveBytes() as counter:
        step(batch)
    states = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
    return {
        "calls": dict(counter.calls),
        "bytes": dict(counter.bytes),
        "param_bytes": _local_bytes(pm.parameters()),
        "optimizer_bytes": _local_bytes(states),
        "total_param_bytes": total_param_bytes,
        "rank": dist.get_rank(),
    }


def theory(layout_name: str, total_param_bytes: int) -> dict[str, int]:
    activation = BATCH * SEQ * DIM * 4
    if layout_name == "tp2":
        # 4 per layer (2 forward, 2 backward) + embedding forward + LM-head input gradient.
        return {"all-reduce": (4 * LAYERS + 2) * activation}
    return {"all-gather": 2 * total_param_bytes, "reduce-scatter": total_param_bytes}


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        f"GPT from the gpt-tiny preset, {LAYERS} layers, d={DIM}, vocab={VOCAB}, B={BATCH}, T={SEQ}, fp32, "
        "2 processes (gloo); one training step with AdamW, rank 0.",
        "",
        "| layout | collective | calls | bytes measured | analytical minimum |",
        "|---|---|---|---|---|",
    ]
    for name, r in results.items():
        minimum = theory(name, r["total_param_bytes"])
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
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the raw numbers to this file")
    args = parser.parse_args(argv)
    layouts = {"tp2": {"tensor_parallel_size": 2}, "zero3-dp2": {"data_parallel_size": 2, "zero_stage": 3}}
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
