"""The rate torch's fused attention reaches here, against what the planner assumes for this device.

``python -m benchmarks.attention_rate [--lengths 1024 8192 32768] [--head-dims 64 128] [--out DIR]``
times causal ``scaled_dot_product_attention`` forward and backward (bf16 on a GPU, fp32 on a CPU) for
each sequence length and head size, counts FLOPs as the planner does for a fused kernel (forward
``4·b·a·s²·d / 2`` under the causal mask, flops.layer_flops; backward ``FLASH_BACKWARD`` times it,
step_time.py), and divides by the bf16 peak of the running device's preset (devices.running_preset).
It prints each case's fraction of peak beside the preset's ``attention_fraction`` and writes
``attention_rate_<device>.json``. On a CPU there is no preset: the rate is printed, the fraction is not.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from brickwork.parallel.planner.devices import running_preset
from brickwork.parallel.planner.step_time import FLASH_BACKWARD

from .report import device_name, device_slug
from .timing import time_ms

# Tokens a case keeps on the device: batch × length, so that short sequences still fill a GPU.
TOKENS_PER_CASE = 65536


def causal_forward_flops(batch: int, heads: int, length: int, dim_head: int) -> float:
    """FLOPs of one causal attention forward, ``QKᵀ`` and ``softmax·V`` over the unmasked half."""
    return 4.0 * batch * heads * length * length * dim_head / 2


def measure(batch: int, heads: int, length: int, dim_head: int, device: torch.device) -> dict[str, float]:
    """One case: forward and backward milliseconds and TFLOP/s by the planner's count."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    q, k, v = (
        torch.randn(batch, heads, length, dim_head, device=device, dtype=dtype, requires_grad=True)
        for _ in range(3)
    )
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    grad = torch.randn_like(out)
    forward_ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), device)[0]
    backward_ms = time_ms(lambda: out.backward(grad, retain_graph=True), device, (q, k, v))[0]
    forward = causal_forward_flops(batch, heads, length, dim_head)
    return {
        "forward_ms": forward_ms,
        "backward_ms": backward_ms,
        "forward_tflops": forward / forward_ms / 1e9,
        "backward_tflops": FLASH_BACKWARD * forward / backward_ms / 1e9,
        "step_tflops": (1 + FLASH_BACKWARD) * forward / (forward_ms + backward_ms) / 1e9,
    }


def run(lengths: Sequence[int], head_dims: Sequence[int], width: int, device: torch.device) -> dict:
    """Every (length, head size) case at ``width`` (heads × head size), and the device's preset."""
    preset = running_preset(device)
    rows = []
    for dim_head in head_dims:
        for length in lengths:
            batch = max(1, TOKENS_PER_CASE // length)
            heads = width // dim_head
            row = {"length": length, "dim_head": dim_head, "batch": batch, "heads": heads}
            row.update(measure(batch, heads, length, dim_head, device))
            if preset is not None:
                row["fraction_of_peak"] = row["step_tflops"] * 1e12 / preset.peak_flops("bf16")
            rows.append(row)
    return {
        "device": device_name(device),
        "torch": torch.__version__,
        "preset": None if preset is None else preset.name,
        "preset_attention_fraction": None if preset is None else preset.attention_fraction,
        "rows": rows,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192, 32768])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--width", type=int, default=2048, help="heads × head size")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    uneven = [d for d in args.head_dims if d <= 0 or args.width % d]
    if uneven:
        parser.error(f"--width {args.width} is not a whole number of heads of size {uneven}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    result = run(args.lengths, args.head_dims, args.width, device)
    fraction = result["preset_attention_fraction"]
    print(f"{result['device']}: preset {result['preset']}, attention_fraction {fraction}")
    for row in result["rows"]:
        fraction = row.get("fraction_of_peak")
        share = "" if fraction is None else f"  {fraction:.2f} of peak"
        print(
            f"s={row['length']:>6} d={row['dim_head']:>3}: forward {row['forward_tflops']:.3g}, backward "
            f"{row['backward_tflops']:.3g}, both {row['step_tflops']:.3g} TFLOP/s{share}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"attention_rate_{device_slug(result['device'])}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
