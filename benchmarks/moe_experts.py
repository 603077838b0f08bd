"""A mixture-of-experts bank, forward + backward: one grouped GEMM per projection against the loop.

``python -m benchmarks.moe_experts [--tokens 8192] [--dim 1024] [--hidden 2816] [--experts 8]
[--top-k 2] [--expert swiglu] [--bias | --no-bias] [--out DIR]`` routes ``tokens`` random tokens
through one MixtureOfExperts layer (its experts with biases, the layer's default, or with
``--no-bias`` without) and times its :class:`~brickwork.components.feedforward.moe.Experts` bank on
the rows the router grouped, with ``grouped=True`` (components/feedforward/grouped_experts.py) and
``grouped=False`` (the loop over the experts), in bf16 on CUDA and fp32 on a CPU:

- ``ms``: the median of ``--repeats`` forward + backward passes, after ``--warmup`` untimed ones;
- ``tflops``: the matmul work, ``6 * rows * dim * hidden`` per projection (forward 2, backward 4),
  over that time;
- ``max_abs_diff``: the largest difference of the bank's output from the loop's.

On CUDA the grouped row needs a device whose fast grouped kernel serves bf16 (compute capability 9.x
or 10.x); elsewhere torch's grouped_mm falls back to a loop of its own. Writes
``moe_experts_<device>.json`` (``_no_bias`` added with ``--no-bias``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from brickwork.components.feedforward import MixtureOfExperts

from .report import device_slug


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run(
    tokens: int,
    dim: int,
    hidden: int,
    experts: int,
    top_k: int,
    expert: str,
    warmup: int,
    repeats: int,
    bias: bool = True,
) -> list[dict[str, object]]:
    """One row per provider (``grouped``, ``loop``) on the same weights and rows."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    moe = MixtureOfExperts(dim, num_experts=experts, top_k=top_k, hidden_dim=hidden, expert=expert, bias=bias)
    moe = moe.to(device, dtype)
    x = torch.randn(tokens, dim, device=device, dtype=dtype)
    with torch.no_grad():
        _, _, chosen = moe.route(x)
    order = chosen.flatten().argsort(stable=True)
    rows = x[order // top_k]
    counts = torch.bincount(chosen.flatten(), minlength=experts)
    grad = torch.randn_like(rows)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    bank, outputs, results = moe.experts, {}, []
    for provider in ("grouped", "loop"):
        bank.grouped = provider == "grouped"
        seconds = []
        for step in range(warmup + repeats):
            synchronize(device)
            start = time.perf_counter()
            out = bank(rows, counts)
            out.backward(grad)
            synchronize(device)
            if step >= warmup:
                seconds.append(time.perf_counter() - start)
        outputs[provider] = out.detach()
        bank.zero_grad(set_to_none=True)
        ms = 1e3 * statistics.median(seconds)
        flops = 6 * rows.shape[0] * dim * hidden * len(bank[0].projections())
        results.append({
            "provider": provider, "device": name,
            "dtype": str(dtype).removeprefix("torch."), "tokens": tokens, "dim": dim, "hidden": hidden,
            "experts": experts, "top_k": top_k, "expert": expert, "bias": bias, "ms": round(ms, 3),
            "tflops": round(flops / (ms * 1e-3) / 1e12, 2),
        })  # fmt: skip
    for row in results:
        row["max_abs_diff"] = (outputs[row["provider"]] - outputs["loop"]).abs().max().item()
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=2816)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--expert", default="swiglu", choices=["mlp", "glu", "swiglu", "geglu"])
    parser.add_argument("--bias", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    rows = run(
        args.tokens,
        args.dim,
        args.hidden,
        args.experts,
        args.top_k,
        args.expert,
        args.warmup,
        args.repeats,
        args.bias,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"moe_experts_{device_slug(str(rows[0]['device']))}{'' if args.bias else '_no_bias'}.json"
    (args.out / name).write_text(json.dumps(rows, indent=1) + "\n")
    for row in rows:
        print(
            f"{row['provider']:8s} {row['device']} {row['dtype']}  {row['ms']:9.3f} ms  "
            f"{row['tflops']:7.2f} TFLOP/s  max |diff| from the loop {row['max_abs_diff']:.3g}"
        )


if __name__ == "__main__":
    main()
