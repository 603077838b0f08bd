"""``brickwork train`` against a plain-torch loop of the same model, on CPU: time per iteration and loss.

The plain loop is ``benchmarks/nanogpt_reference.py``: the model and training loop written the way
nanoGPT writes them. Both train the same byte-level text at nanoGPT's CPU recipe (4 layers x 128,
4 heads, context 64, batch 12, AdamW with betas (0.9, 0.99), weight decay 0.1, gradient clipping at 1,
warmup then cosine decay of the learning rate). brickwork runs its real command: the function behind
``brickwork train`` with dotted overrides, run folder, evaluation and checkpoint included.

- ``speed`` (default): each measurement is a fresh process training ``--iters SHORT LONG`` iterations;
  the difference of the two, over the difference in iterations, is the time per iteration with the
  start-up (imports, model build, evaluation, checkpoint) cancelled out. Wall and CPU time (all
  threads) of the process's training call. Repeats alternate brickwork and plain; medians are reported.
- ``quality``: both train ``--quality-iters`` iterations (default 2000) on a generated text of tiny
  Shakespeare's size (1,115,394 bytes of the embedded corpus's tales), the last tenth held out; the
  validation loss of each on the same held-out windows, and CPU ms per iteration, side by side.

Run from the repository root: ``python -m benchmarks.train_loop`` (``--help`` for the options). The
results go to ``benchmarks/results/train_loop_<device>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from . import nanogpt_reference as ref

TINY_SHAKESPEARE_BYTES = 1_115_394
VAL_FRACTION = 0.1
EVAL_BATCHES = 20  # nanoGPT's eval_iters in its CPU command line
IMPLEMENTATIONS = ("brickwork", "plain")


def corpus(size: int | None) -> bytes:
    """The embedded corpus's tales, generated on to ``size`` bytes (None: the shipped corpus)."""
    from brickwork.data.tales import generate_tales

    if size is None:
        return generate_tales().encode()
    tales = 600
    while len(text := generate_tales(num_tales=tales).encode()) < size:
        tales = tales * 2
    return text[:size]


def held_out(
    tokens: torch.Tensor, r: ref.Recipe
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """(training tokens, validation batches): the last tenth is held out, scored on evenly spaced
    windows, ``EVAL_BATCHES`` batches of them, the way ``brickwork train`` splits and scores its data."""
    n_val = max(math.ceil(tokens.numel() * VAL_FRACTION), r.block_size + 1)
    train, val = tokens[:-n_val], tokens[-n_val:]
    last = val.numel() - r.block_size - 1
    starts = torch.linspace(0, last, EVAL_BATCHES * r.batch_size).round().long().unique()
    windows = val[starts[:, None] + torch.arange(r.block_size + 1)]
    x, y = windows[:, :-1], windows[:, 1:]
    return train, list(zip(x.split(r.batch_size), y.split(r.batch_size)))


def recipe(iters: int) -> ref.Recipe:
    return ref.Recipe(max_iters=iters, warmup_iters=min(100, iters // 10))


def train_plain(text: bytes, iters: int) -> float:
    """nanoGPT's loop on ``text``; returns the final validation loss."""
    r = recipe(iters)
    train, val = held_out(torch.frombuffer(bytearray(text), dtype=torch.uint8).long(), r)
    model, optimizer = ref.build(r, vocab_size=256)
    ref.evaluate(model, val)
    ref.train(model, optimizer, train, r, iters)
    return ref.evaluate(model, val)


def train_brickwork(text: bytes, iters: int) -> float:
    """``brickwork train`` on ``text`` at the same recipe; returns the final validation loss."""
    from brickwork.train.trainer import train_new

    r = recipe(iters)
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "input.txt"
        data.write_bytes(text)
        overrides = [
            f"data.path={data}",
            f"data.val_fraction={VAL_FRACTION}",
            f"max_seq_len={r.block_size}",
            f"train.out_dir={Path(folder) / 'run'}",
            f"train.steps={iters}",
            f"train.seq_len={r.block_size}",
            f"train.batch_size={r.batch_size}",
            f"train.lr={r.learning_rate}",
            f"train.min_lr={r.min_lr}",
            f"train.warmup_steps={r.warmup_iters}",
            f"train.betas=[{r.beta1},{r.beta2}]",
            f"train.weight_decay={r.weight_decay}",
            f"train.grad_clip={r.grad_clip}",
            f"train.eval_batches={EVAL_BATCHES}",
            f"train.eval_interval={iters}",
            f"train.checkpoint_interval={iters}",
            "train.sample_tokens=0",
            "train.device=cpu",
        ]
        with contextlib.redirect_stdout(io.StringIO()):
            result = train_new("gpt-tiny", overrides)
    return result.final_val_loss


def child(implementation: str, iters: int, size: int | None) -> dict:
    """One measurement, in this process: the training call's wall and CPU seconds, and its loss."""
    from brickwork.train.heap import keep_freed_memory

    text = corpus(size)
    train = train_brickwork if implementation == "brickwork" else train_plain
    # brickwork train flushes subnormal floats on CPU and fixes glibc's heap thresholds
    # (brickwork/train/heap.py); the plain loop runs with the same FPU mode and heap, so the comparison
    # measures the loops, not those switches.
    torch.set_flush_denormal(True)
    keep_freed_memory()
    wall, cpu = time.perf_counter(), time.process_time()
    val_loss = train(text, iters)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"wall_s": wall, "cpu_s": cpu, "val_loss": val_loss, "threads": torch.get_num_threads()}


def measure(implementation: str, iters: int, size: int | None, threads: int | None) -> dict:
    """:func:`child` in a fresh interpreter (so no run inherits another's caches or thread pool)."""
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    # This module's own name: benchmarks.train_loop from a checkout, brickwork.benchmarks... installed.
    command = [sys.executable, "-m", __spec__.name, "--child", implementation, str(iters)]
    if size is not None:
        command += ["--size", str(size)]
    load = os.getloadavg()[0]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-4000:]}")
    # The 1-minute load average before and after: on a shared host, what else competed for the cores.
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "load": [load, os.getloadavg()[0]]}


def speed(short: int, long: int, repeats: int, threads: int | None, log) -> dict:
    """Per-iteration wall and CPU ms of each implementation: medians over ``repeats`` differenced pairs."""
    per_iter: dict[str, list[dict]] = {name: [] for name in IMPLEMENTATIONS}
    for repeat in range(repeats):
        order = IMPLEMENTATIONS if repeat % 2 == 0 else IMPLEMENTATIONS[::-1]
        for name in order:
            a, b = (measure(name, n, None, threads) for n in (short, long))
            ms = {k: 1e3 * (b[f"{k}_s"] - a[f"{k}_s"]) / (long - short) for k in ("wall", "cpu")}
            load = [*a.get("load", []), *b.get("load", [])]
            per_iter[name].append({**ms, "threads": b["threads"], "load": load})
            log(
                f"repeat {repeat + 1}/{repeats} {name:9s} {ms['wall']:7.2f} ms wall {ms['cpu']:7.2f} ms CPU"
                + (f", load average {min(load):.1f}-{max(load):.1f}" if load else "")
            )
    out = {"iters": [short, long], "repeats": repeats, "runs": per_iter}
    for name, rows in per_iter.items():
        out[name] = {k: statistics.median(r[k] for r in rows) for k in ("wall", "cpu")}
    out["ratio"] = {k: out["brickwork"][k] / out["plain"][k] for k in ("wall", "cpu")}
    # Each pair's own ratio (the repeat's brickwork over its plain): the load moves between pairs.
    out["pair_ratios"] = [
        {k: b[k] / p[k] for k in ("wall", "cpu")} for b, p in zip(per_iter["brickwork"], per_iter["plain"])
    ]
    out["threads"] = per_iter["brickwork"][0]["threads"]
    loads = [x for rows in per_iter.values() for r in rows for x in r["load"]]
    out["load"] = [min(loads), statistics.median(loads), max(loads)] if loads else None
    return out


def quality(iters: int, size: int, threads: int | None, log) -> dict:
    """Validation loss and CPU ms per iteration after ``iters`` iterations of each, on ``size`` bytes."""
    out = {"iters": iters, "bytes": size}
    for name in IMPLEMENTATIONS:
        run = measure(name, iters, size, threads)
        out[name] = {"val_loss": run["val_loss"], "cpu_ms_per_iter": 1e3 * run["cpu_s"] / iters,
                     "wall_ms_per_iter": 1e3 * run["wall_s"] / iters}  # fmt: skip
        log(f"{name:9s} val loss {run['val_loss']:.4f}, {out[name]['cpu_ms_per_iter']:.2f} CPU ms/iteration")
    return out


def markdown(result: dict) -> str:
    """The tables docs/benchmarks.md shows."""
    lines = [
        f"{result['device']}, {result['cores']} cores, torch {result['torch']}; {result['machine_note']}",
        "",
    ]
    if "speed" in result:
        s = result["speed"]
        load = s.get("load")
        during = f"; load average {load[0]:.1f} to {load[2]:.1f}, median {load[1]:.1f}" if load else ""
        pairs = ", ".join(f"{r['cpu']:.3f}" for r in s.get("pair_ratios", []))
        lines += [
            f"Per iteration, {s['threads']} threads, median of {s['repeats']} differenced pairs "
            f"({s['iters'][1]} - {s['iters'][0]} iterations){during}:",
            "",
            "| loop | wall ms | CPU ms |",
            "|---|---|---|",
            f"| plain torch (nanoGPT's structure) | {s['plain']['wall']:.2f} | {s['plain']['cpu']:.2f} |",
            f"| brickwork train | {s['brickwork']['wall']:.2f} | {s['brickwork']['cpu']:.2f} |",
            f"| brickwork / plain | {s['ratio']['wall']:.3f}x | {s['ratio']['cpu']:.3f}x |",
            "",
            *([f"Each pair's CPU ratio, in order: {pairs}.", ""] if pairs else []),
        ]
    if "quality" in result:
        q = result["quality"]
        lines += [
            f"{q['iters']} iterations on {q['bytes']:,} bytes of generated tales (tiny Shakespeare's size):",
            "",
            "| loop | validation loss | CPU ms / iteration |",
            "|---|---|---|",
            *(f"| {n} | {q[n]['val_loss']:.4f} | {q[n]['cpu_ms_per_iter']:.2f} |" for n in IMPLEMENTATIONS),
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("speed", "quality", "both"), default="speed")
    parser.add_argument("--iters", type=int, nargs=2, default=(50, 250), metavar=("SHORT", "LONG"))
    parser.add_argument("--repeats", type=int, default=5, help="differenced pairs per loop (median)")
    parser.add_argument("--quality-iters", type=int, default=2000)
    parser.add_argument(
        "--size", type=int, help="bytes of text for quality (default: tiny Shakespeare's size)"
    )
    parser.add_argument(
        "--threads", type=int, help="OMP_NUM_THREADS of every run (default: the process default)"
    )
    parser.add_argument("--note", default="", help="what else ran on the machine, for the record")
    parser.add_argument("--out", default="benchmarks/results", help="results folder ('' writes nothing)")
    parser.add_argument("--child", nargs=2, metavar=("LOOP", "ITERS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        implementation, iters = args.child
        print(json.dumps(child(implementation, int(iters), args.size)))
        return 0
    short, long = args.iters
    if not 0 < short < long:
        parser.error(f"--iters SHORT LONG needs 0 < SHORT < LONG, got {short} {long}")

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    from .report import device_name, device_slug

    result = {
        "device": device_name(torch.device("cpu")),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine_note": args.note or "no note on other load",
    }
    if args.mode in ("speed", "both"):
        result["speed"] = speed(short, long, args.repeats, args.threads, log)
    if args.mode in ("quality", "both"):
        result["quality"] = quality(
            args.quality_iters, args.size or TINY_SHAKESPEARE_BYTES, args.threads, log
        )
    table = markdown(result)
    print(table)
    if args.out:
        # One file per thread count asked for, so that runs at 1 and 2 threads stand side by side.
        suffix = f"_{args.threads}threads" if args.threads is not None else ""
        stem = Path(args.out) / f"train_loop_{device_slug(result['device'])}{suffix}"
        stem.parent.mkdir(parents=True, exist_ok=True)
        stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
        stem.with_suffix(".md").write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
