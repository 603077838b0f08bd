"""``python -m benchmarks.train_gpu``: a training step of GPT-2 small and of a Llama-shaped decoder,
brickwork against plain-torch loops, every row in one process and one run.

Per shape (benchmarks/train_gpu_shapes.py), eager and compiled (benchmarks/train_gpu_rows.py):

- ``plain``: nanoGPT's structure, no brickwork import; the bar brickwork is judged by;
- ``brickwork``: brickwork's model of the same spec in the same bare loop: the model's speed alone;
- ``fp8``: the same with the layers' large linears in float8 (torchao, tensorwise): fp8 against bf16;
- ``packed``: the same on packed documents (``data.pack``: document-causal attention, positions
  restarting per document): the cost of the document mask;
- ``cli``: ``brickwork train`` itself, its rate read from the run's metrics.jsonl.

Each row gives tokens/s, step ms, MFU, peak memory (CUDA), the first step's loss (every row trains
the same problem: near ln(vocabulary) at random weights), its warm-up and wall seconds, and the ratios
and targets of benchmarks/train_gpu_report.py. Rows print as they finish; the results go to
``--out``/``train_gpu_<device>.json`` and ``.md`` (``train_gpu_<device>_tiny.*`` at the tiny shapes),
rewritten after each row.

Without CUDA, or with ``--tiny``, the shapes are the tiny twins (2 layers, 64 wide, vocabulary 251)
in float32; on a CPU the compiled rows run only with ``--cpu-compile``. The full run is sized for
under 5 minutes on one H100, compilation included.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from brickwork.train.mfu import run_utilization

from .report import device_name, device_slug
from .train_gpu_report import add_ratios, markdown, verdicts
from .train_gpu_rows import IMPLEMENTATIONS, MODES, Row, Settings, measure
from .train_gpu_shapes import FULL_SHAPES, TINY_SHAPES, Shape

MFU_CONVENTION = (
    "as brickwork train logs it (brickwork/train/mfu.py): model FLOPs per token 6·N + 12·L·H·Q·T "
    "(N: the weights in matmuls, LM head included; the whole attention square) times tokens/s, over "
    "the device's dense peak at the step's precision (parallel/planner/devices.py presets)."
)


def select_rows(shapes: Sequence[Shape], patterns: Sequence[str], compiled: bool) -> list[Row]:
    """Every row whose name (``shape/implementation/mode``) matches one of ``patterns`` (shell-style);
    the compiled ones only if ``compiled``."""
    rows = [Row(s, i, m) for s in shapes for i in IMPLEMENTATIONS for m in MODES if compiled or m == "eager"]
    return [r for r in rows if any(fnmatch.fnmatchcase(r.name, p) for p in patterns)]


def describe(row: dict) -> str:
    """One progress line for a finished row."""
    if "error" in row:
        return f"failed after {row['wall_s']:.1f} s: {row['error'][:300]}"
    parts = [f"{row['tokens_per_s']:>12,.0f} tok/s", f"{row['step_ms']:8.1f} ms"]
    if row.get("mfu") is not None:
        parts.append(f"MFU {row['mfu']:.1%}")
    if "peak_gib" in row:
        parts.append(f"{row['peak_gib']:.2f} GiB")
    parts.append(f"first loss {row['first_loss']:.3f}, wall {row['wall_s']:.1f} s")
    return "  ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.train_gpu", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--steps", type=int, default=10, help="timed steps a row (default 10)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    parser.add_argument(
        "--rows", nargs="+", default=["*"], metavar="PATTERN",
        help="rows to run, by shell pattern on shape/implementation/mode (e.g. 'gpt2*' '*/compiled')",
    )  # fmt: skip
    parser.add_argument("--out", default="benchmarks/results", help="results folder ('' writes nothing)")
    parser.add_argument("--tiny", action="store_true", help="the tiny shapes (always without CUDA)")
    parser.add_argument("--cpu-compile", action="store_true", help="run the compiled rows on a CPU too")
    ns = parser.parse_args(argv)
    if ns.steps < 1 or ns.warmup < 1:
        parser.error(f"--steps and --warmup must be >= 1, got {ns.steps} and {ns.warmup}")
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    tiny = ns.tiny or not cuda
    shapes = TINY_SHAPES if tiny else FULL_SHAPES
    rows = select_rows(shapes, ns.rows, compiled=cuda or ns.cpu_compile)
    if not rows:
        parser.error(f"no row matches {ns.rows}" + ("" if cuda else " (compiled rows need --cpu-compile)"))
    precision = "bf16-mixed" if cuda else "fp32"
    name = device_name(device)
    # Every row of a shape is divided by the same FLOPs: the plain models have brickwork's weights.
    utilization = {s.name: run_utilization(s.spec(), s.seq_len, precision, device, 1) for s in shapes}
    first = utilization[shapes[0].name]
    metadata = {
        "device": name, "torch": torch.__version__, "cuda": torch.version.cuda,
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "scale": "tiny" if tiny else "full", "precision": precision, "warmup": ns.warmup, "steps": ns.steps,
        "peak_flops": first.peak_flops, "mfu_convention": MFU_CONVENTION, "mfu_unknown": first.unknown,
        "flops_per_token": {shape: u.flops_per_token for shape, u in utilization.items()},
        "targets_judged": cuda and not tiny,
    }  # fmt: skip

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    stem = Path(ns.out) / f"train_gpu_{device_slug(name)}{'_tiny' if tiny else ''}" if ns.out else None

    def report(results: list[dict]) -> str:
        """The tables of the rows so far, written after each row: a run stopped at a time limit keeps
        the rows it finished."""
        add_ratios(results)
        lines = verdicts(results, metadata["targets_judged"])
        table = markdown(metadata, results, lines)
        if stem is not None:
            stem.parent.mkdir(parents=True, exist_ok=True)
            # Appended, not with_suffix: a device name may hold a dot ("2.10GHz").
            Path(f"{stem}.json").write_text(
                json.dumps({**metadata, "rows": results, "targets": lines}, indent=1) + "\n"
            )
            Path(f"{stem}.md").write_text(table)
        return table

    results = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="train_gpu-") as work:
        settings = Settings(device, ns.warmup, ns.steps, precision, Path(work))
        for number, row in enumerate(rows, start=1):
            log(f"[{number}/{len(rows)}] {row.name} ...")
            result = measure(row, settings)
            if "tokens_per_s" in result:
                result["mfu"] = utilization[row.shape.name].mfu(result["tokens_per_s"])
            log(f"[{number}/{len(rows)}] {row.name:<28} {describe(result)}")
            results.append(result)
            table = report(results)
    log(f"{len(rows)} rows in {time.perf_counter() - started:.0f} s")
    print(table)
    if stem is not None:
        log(f"wrote {stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
