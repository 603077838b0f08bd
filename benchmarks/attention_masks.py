"""Sparse attention patterns: FlexAttention block masks against the dense-mask SDPA path.

``python -m benchmarks.attention_masks [--lengths 256 512 1024] [--out DIR]`` times the forward of
each pattern (``local``, ``random``, ``global``, ``blocksparse``) on both backends, after checking
that they agree, and writes ``attention_masks.json`` / ``.csv``. On CUDA FlexAttention runs compiled
(the fast path); on CPU it runs eagerly, which materializes the scores, so CPU numbers show the cost
of the reference path, not the sparse kernel's speed-up. Also reports the density of each pattern:
the fraction of (query, key) pairs it keeps, which bounds what a sparse kernel can save.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from brickwork.components.attention import (
    BlockSparseAttention,
    GlobalAttention,
    LocalAttention,
    PatternAttention,
    RandomAttention,
)
from brickwork.components.attention.flex import compiled_flex_attention

from .timing import time_ms


def patterns() -> dict[str, PatternAttention]:
    return {
        "local (window 64)": LocalAttention(window_size=65),
        "random (r 0.1)": RandomAttention(r=0.1),
        "global (4 tokens)": GlobalAttention(num_global_tokens=4),
        "blocksparse (64, local+first)": BlockSparseAttention(block_size=64),
    }


def run(lengths: Sequence[int], batch: int, heads: int, dim_head: int) -> list[dict[str, object]]:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows: list[dict[str, object]] = []
    cases = [(name, t) for name in patterns() for t in lengths]
    for name, t in tqdm(cases, unit="case"):
        pattern = patterns()[name].to(device)
        q, k, v = (torch.randn(batch, heads, t, dim_head, device=device, dtype=dtype) for _ in range(3))
        times = {}
        outputs = {}
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager FlexAttention on CPU warns that it is unfused
            for backend in ("flex", "masked"):
                pattern.backend = backend
                outputs[backend] = pattern(q, k, v)
                times[backend] = time_ms(functools.partial(pattern, q, k, v), device)[0]
        difference = (outputs["flex"].float() - outputs["masked"].float()).abs().max().item()
        density = pattern.dense_keep(t, t, device).float().mean().item()
        rows.append({
            "pattern": name, "seq_len": t, "device": device.type, "dtype": str(dtype).removeprefix("torch."),
            "flex_ms": round(times["flex"], 4), "dense_ms": round(times["masked"], 4),
            "flex_over_dense": round(times["flex"] / times["masked"], 3), "density": round(density, 4),
            "max_abs_difference": difference,
        })  # fmt: skip
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim-head", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    if torch.cuda.is_available():
        compiled_flex_attention()  # compile outside the timed calls
    rows = run(args.lengths, args.batch, args.heads, args.dim_head)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "attention_masks.json").write_text(json.dumps(rows, indent=1) + "\n")
    with open(args.out / "attention_masks.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    for row in rows:
        print(
            f"{row['pattern']:32s} T={row['seq_len']:5d}  flex {row['flex_ms']:9.3f} ms  "
            f"dense {row['dense_ms']:9.3f} ms  density {row['density']:.3f}  "
            f"diff {row['max_abs_difference']:.1e}"
        )


if __name__ == "__main__":
    main()
