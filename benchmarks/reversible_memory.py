"""Peak memory of a training step (forward + backward) against depth: plain blocks and a reversible stack.

``python -m benchmarks.reversible_memory [--depths 4 8 16] [--out DIR]`` builds decoder stacks of
each depth from one spec, with ``reversible`` off and on, and measures one forward + backward:

- ``peak_mib``: on CUDA, ``torch.cuda.max_memory_allocated`` above what was allocated before the step;
  on CPU, the peak of the running sum of the allocations and frees the torch profiler records
  (``profile_memory=True``; each op's own net allocation, in the order the ops start), which is the
  CPU allocator's view of the same thing;
- ``saved_mib``: the bytes autograd keeps for the backward pass (each storage once), through
  ``torch.autograd.graph.saved_tensors_hooks``: the activation memory itself.

Writes ``reversible_memory.json``. The gradients grow with depth in both variants (as many bytes as
the weights, allocated during the step), so ``peak_beyond_grads_mib`` takes them out: the rest is
the activations, which the reversible stack keeps flat.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from tqdm import tqdm

from brickwork.factory import build_model

MIB = 2**20


def spec(depth: int, reversible: bool, dim: int, seq_len: int) -> dict:
    return {
        "model": "decoder_lm", "vocab_size": 256, "dim_model": dim, "max_seq_len": seq_len,
        "decoder": {"num_layers": depth, "reversible": reversible,
                    "block": {"attention": {"num_heads": 4}, "feedforward": {"name": "mlp"}}},
    }  # fmt: skip


def saved_bytes(model: torch.nn.Module, ids: torch.Tensor) -> int:
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(ids)
    return sum(storages.values())


def peak_bytes(model: torch.nn.Module, ids: torch.Tensor) -> int:
    def step() -> None:
        model(ids).float().square().mean().backward()

    if ids.is_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        return torch.cuda.max_memory_allocated() - before
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    running = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        running += event.self_cpu_memory_usage  # allocations positive, frees negative
        peak = max(peak, running)
    return peak


def run(depths: Sequence[int], dim: int, seq_len: int, batch: int) -> list[dict[str, object]]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for depth, reversible in tqdm([(d, r) for d in depths for r in (False, True)], unit="model"):
        torch.manual_seed(0)
        model = build_model(spec(depth, reversible, dim, seq_len)).to(device)
        ids = torch.randint(0, 256, (batch, seq_len), device=device)
        peak = peak_bytes(model, ids)
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        rows.append({
            "depth": depth, "reversible": reversible, "device": device.type,
            "peak_mib": round(peak / MIB, 2), "peak_beyond_grads_mib": round((peak - weights) / MIB, 2),
            "saved_mib": round(saved_bytes(model, ids) / MIB, 2), "weights_mib": round(weights / MIB, 2),
        })  # fmt: skip
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    rows = run(args.depths, args.dim, args.seq_len, args.batch)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "reversible_memory.json").write_text(json.dumps(rows, indent=1) + "\n")
    for row in rows:
        print(
            f"depth {row['depth']:3d}  reversible={row['reversible']!s:5s}  peak {row['peak_mib']:8.2f} MiB  "
            f"(beyond gradients {row['peak_beyond_grads_mib']:8.2f})  "
            f"saved activations {row['saved_mib']:8.2f} MiB  weights {row['weights_mib']:6.2f} MiB"
        )


if __name__ == "__main__":
    main()
