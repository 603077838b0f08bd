"""Benchmark results on disk: JSON (metadata + rows), CSV, a Markdown table with targets, and a plot."""

from __future__ import annotations

import csv
import datetime
import importlib.metadata
import json
import platform
import re
from pathlib import Path

import torch

from .cases import KernelBench
from .selection import MODES

FIELDS = (
    "kernel", "provider", "dtype", "rows", "width", "mode",
    "ms", "ms_p20", "ms_p80", "host_ms", "gbps", "bandwidth_fraction", "copy_gbps", "error",
)  # fmt: skip
KEY = ("kernel", "provider", "dtype", "rows", "width", "mode")
# Every ratio column reads one way: how many times faster brickwork is (the other's time over
# brickwork's), so higher is better; the model table says the same of HF.
SPEEDUP_VS_TORCH = "× faster than torch (higher is better)"


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            models = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        return f"CPU {models[0]}" if models else f"CPU {platform.machine()}"
    except OSError:
        return f"CPU {platform.processor() or platform.machine()}"


def device_slug(name: str) -> str:
    """A file-name-safe form of the device name: ``NVIDIA H100 80GB HBM3`` -> ``NVIDIA_H100_80GB_HBM3``."""
    return re.sub(r"[^A-Za-z0-9.]+", "_", name).strip("_")


def run_metadata(device: torch.device, copy_gbps: float) -> dict:
    return {
        "device": device_name(device),
        "device_type": device.type,
        "gpu_present": device.type == "cuda",
        "copy_bandwidth_gbps": copy_gbps,
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "triton": _version("triton"),
            "cuda": torch.version.cuda,
            "brickwork": _version("brickwork"),
        },
    }


def merge_rows(old: list[dict], new: list[dict]) -> list[dict]:
    """``old`` rows with every case that ``new`` measured again replaced, in a stable order."""
    fresh = {tuple(r[k] for k in KEY) for r in new}
    return [r for r in old if tuple(r[k] for k in KEY) not in fresh] + new


def write_json(path: Path, metadata: dict, rows: list[dict]) -> None:
    path.write_text(json.dumps({**metadata, "results": rows}, indent=1) + "\n")


def write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows({k: row.get(k) for k in FIELDS} for row in rows)


def _verdict(bench: KernelBench, row: dict, torch_row: dict | None, gpu: bool) -> tuple[str, str]:
    """(target text, met) for one brickwork row; targets apply to GPU runs only."""
    if not gpu:
        return "- (CPU run)", "n/a"
    parts, met = [], True
    for target in bench.targets:
        if target.covers(row["mode"], row["width"]):
            parts.append(f">= {target.fraction:.0%} BW")
            met &= row["bandwidth_fraction"] >= target.fraction
    if row["width"] >= 1024 and torch_row is not None and torch_row.get("ms"):
        parts.append("> torch")
        met &= row["ms"] < torch_row["ms"]
    return ", ".join(parts) or "-", "yes" if met else "**no**"


def markdown_table(metadata: dict, rows: list[dict], benches: dict[str, KernelBench]) -> str:
    """One line per (kernel, mode, dtype, width): brickwork's time and bandwidth against the others."""
    gpu = metadata["gpu_present"]
    ok = [r for r in rows if r.get("ms")]
    providers = [
        p for p in ("torch", "torch.compile", "liger", "apex") if any(r["provider"] == p for r in ok)
    ]
    index = {tuple(r[k] for k in KEY): r for r in ok}
    # Host time is measured apart from device time on GPU only; on CPU all time is host time.
    hosts = [p for p in ("brickwork", "torch") if any(r["provider"] == p and r.get("host_ms") for r in ok)]
    head = ["kernel", "mode", "dtype", "width", "brickwork ms", "GB/s", "% copy BW"]
    head += (
        [f"{p} GB/s" for p in providers]
        + [f"{p} host µs" for p in hosts]
        + [SPEEDUP_VS_TORCH, "target", "met"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(
        (r for r in ok if r["provider"] == "brickwork"),
        key=lambda r: (r["kernel"], MODES.index(r["mode"]), r["dtype"], r["width"]),
    ):
        others = {
            p: index.get((r["kernel"], p, r["dtype"], r["rows"], r["width"], r["mode"])) for p in providers
        }
        torch_row = others.get("torch")
        speedup = f"{torch_row['ms'] / r['ms']:.2f}" if torch_row else "-"
        target, met = _verdict(benches[r["kernel"]], r, torch_row, gpu)
        cells = [r["kernel"], r["mode"], r["dtype"], str(r["width"]), f"{r['ms']:.4f}", f"{r['gbps']:.0f}"]
        cells += [f"{100 * r['bandwidth_fraction']:.0f}%"]
        cells += [f"{o['gbps']:.0f}" if o else "-" for o in others.values()]
        host_rows = {"brickwork": r, "torch": torch_row}
        cells += [
            f"{1e3 * h['host_ms']:.0f}" if (h := host_rows[p]) and h.get("host_ms") else "-" for p in hosts
        ]
        lines.append("| " + " | ".join([*cells, speedup, target, met]) + " |")
    return "\n".join(lines) + "\n"


def write_markdown(path: Path, metadata: dict, rows: list[dict], benches: dict[str, KernelBench]) -> None:
    versions = ", ".join(f"{k} {v}" for k, v in metadata["versions"].items() if v)
    intro = [
        f"# Kernel benchmarks on {metadata['device']}",
        "",
        f"{metadata['timestamp']}; {versions}.",
        f"Measured copy bandwidth: {metadata['copy_bandwidth_gbps']:.0f} GB/s. "
        "GB/s counts the minimal bytes each kernel must move (see docs/benchmarks.md).",
    ]
    if not metadata["gpu_present"]:
        intro.append("No GPU present: `brickwork` is its torch twin here, and the GPU targets do not apply.")
    path.write_text("\n".join(intro) + "\n\n" + markdown_table(metadata, rows, benches))


def write_plot(path: Path, metadata: dict, rows: list[dict]) -> bool:
    """GB/s against width, one panel per kernel and mode that ran, for the first dtype; False without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ok = [r for r in rows if r.get("ms")]
    dtypes = sorted({r["dtype"] for r in ok}, key=lambda d: d != "bfloat16")
    kernels = sorted({r["kernel"] for r in ok})
    modes = [m for m in MODES if any(r["mode"] == m for r in ok)]
    if not ok:
        return False
    fig, axes = plt.subplots(
        len(kernels), len(modes), figsize=(4.5 * len(modes), 3.2 * len(kernels)), squeeze=False
    )
    for i, kernel in enumerate(kernels):
        for j, mode in enumerate(modes):
            ax = axes[i][j]
            for provider in sorted({r["provider"] for r in ok if r["kernel"] == kernel}):
                points = sorted(
                    (r["width"], r["gbps"])
                    for r in ok
                    if (r["kernel"], r["mode"], r["provider"], r["dtype"])
                    == (kernel, mode, provider, dtypes[0])
                )
                if points:
                    ax.plot(*zip(*points, strict=True), marker="o", label=provider)
            ax.axhline(
                metadata["copy_bandwidth_gbps"], color="grey", linestyle="--", linewidth=1, label="copy"
            )
            ax.set_xscale("log", base=2)
            ax.set_title(f"{kernel} {mode} ({dtypes[0]})", fontsize=9)
            ax.set_xlabel("row width")
            ax.set_ylabel("GB/s")
            ax.legend(fontsize=7)
    fig.suptitle(metadata["device"], fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True
