"""The benchmark runner: ``python -m benchmarks`` (from the repository) or ``python -m brickwork.benchmarks``.

It sweeps kernels x dtypes x row widths x providers x modes, times each case, and writes
``<out>/<device>.json``, ``.csv``, ``.md`` (the table for docs/benchmarks.md) and ``.png``. Results
for the same device are merged with an earlier run unless ``--fresh`` is given, so a long GPU sweep
can be split by kernel. Without a GPU it times the torch twins on CPU and says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from brickwork.errors import ConfigError
from brickwork.extras import missing_package

from .bias_gelu import BENCH as BIAS_GELU
from .cases import KernelBench
from .layer_norm import BENCH as LAYER_NORM
from .masked_softmax import BENCH as MASKED_SOFTMAX
from .report import (
    device_slug,
    merge_rows,
    run_metadata,
    write_csv,
    write_json,
    write_markdown,
    write_plot,
)
from .rms_norm import BENCH as RMS_NORM
from .selection import DTYPE_NAMES, PROVIDERS, add_selection_arguments, check_selection
from .timing import copy_bandwidth_gbps, mode_step, time_case

BENCHES: dict[str, KernelBench] = {b.name: b for b in (LAYER_NORM, RMS_NORM, BIAS_GELU, MASKED_SOFTMAX)}
DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}
GPU_DEFAULTS = {"widths": [2**k for k in range(10, 17)], "rows": 4096, "dtypes": ["bfloat16", "float32"]}
# CPU runs are a smoke test of the pipeline and a record of the twins' speed, not a tuning target.
CPU_DEFAULTS = {"widths": [1024, 4096, 16384], "rows": 256, "dtypes": ["float32"]}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    add_selection_arguments(parser)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="results folder")
    args = parser.parse_args(argv)
    try:
        check_selection(args)
    except ConfigError as err:
        parser.error(str(err))
    return args


def run_case(
    bench: KernelBench,
    provider: str,
    dtype: str,
    rows: int,
    width: int,
    modes: Sequence[str],
    device: torch.device,
    copy_gbps: float,
) -> list[dict]:
    """``modes`` of one (kernel, provider, dtype, width); [] if the provider is not available here."""
    fn = bench.providers[provider](device)
    if fn is None:
        return []
    inputs = bench.make_inputs(rows, width, DTYPES[dtype], device)
    results = []
    for mode in modes:
        row = {"kernel": bench.name, "provider": provider, "dtype": dtype, "rows": rows, "width": width}
        row |= {"mode": mode, "copy_gbps": copy_gbps, "error": None}
        try:
            step, leaves = mode_step(fn, inputs, mode)
            row["ms"], row["ms_p20"], row["ms_p80"], row["host_ms"] = time_case(step, device, leaves)
        except Exception as exc:  # one failing provider (e.g. out of memory) must not end the sweep
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            print(f"\n{bench.name}/{provider}/{dtype}/{width}/{mode} failed: {row['error']}", file=sys.stderr)
        else:
            row["gbps"] = bench.bytes_moved(mode, rows, width, DTYPES[dtype]) / (row["ms"] * 1e-3) / 1e9
            row["bandwidth_fraction"] = row["gbps"] / copy_gbps
        results.append(row)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    run_kernels(parse_args(argv))
    return 0


def run_kernels(args: argparse.Namespace) -> list[Path]:
    """The sweep ``args`` selects (the flags of selection.py, and ``out``); returns the files written."""
    out = Path(args.out)
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    defaults = GPU_DEFAULTS if gpu else CPU_DEFAULTS
    providers = args.providers or (list(PROVIDERS) if gpu else ["brickwork", "torch"])
    dtypes = args.dtypes or defaults["dtypes"]
    widths = args.widths or defaults["widths"]
    rows = args.rows or defaults["rows"]
    if not gpu:
        torch.set_num_threads(args.threads)
        print("No GPU present: timing the torch twins on CPU (provider 'brickwork' is the twin here) with "
              f"{args.threads} thread(s); the bandwidth targets apply to GPU runs only.")  # fmt: skip
    copy_gbps = copy_bandwidth_gbps(device)
    print(f"device: {device}; measured copy bandwidth {copy_gbps:.1f} GB/s")
    benches = [BENCHES[name] for name in args.kernels]
    cases = [
        (bench, provider, dtype, width)
        for bench in benches
        for dtype in dtypes
        for width in widths
        for provider in providers
        if provider in bench.providers
    ]
    new_rows: list[dict] = []
    with tqdm(cases, unit="case", desc="kernels") as bar:
        for bench, provider, dtype, width in bar:
            bar.set_postfix_str(f"{bench.name} {dtype} {width} {provider}")
            new_rows += run_case(bench, provider, dtype, rows, width, args.modes, device, copy_gbps)
            if gpu:
                torch.cuda.empty_cache()
    metadata = run_metadata(device, copy_gbps)
    if not gpu:
        metadata["cpu_threads"] = args.threads
    out.mkdir(parents=True, exist_ok=True)
    stem = out / device_slug(metadata["device"])
    json_path = stem.with_suffix(".json")
    old_rows = [] if args.fresh or not json_path.exists() else json.loads(json_path.read_text())["results"]
    all_rows = merge_rows(old_rows, new_rows)
    write_json(json_path, metadata, all_rows)
    write_csv(stem.with_suffix(".csv"), all_rows)
    write_markdown(stem.with_suffix(".md"), metadata, all_rows, BENCHES)
    written = [json_path, stem.with_suffix(".csv"), stem.with_suffix(".md")]
    if not args.no_plot:
        if write_plot(stem.with_suffix(".png"), metadata, all_rows):
            written.append(stem.with_suffix(".png"))
        else:
            print(f"no plot written: {missing_package('matplotlib', 'the plot')}")
    print("wrote " + ", ".join(str(p) for p in written))
    return written
