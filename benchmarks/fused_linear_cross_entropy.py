"""LM-head loss benchmark: fused linear + cross-entropy against the unfused head, time and peak memory.

``python -m benchmarks.fused_linear_cross_entropy`` times forward + backward of
``cross_entropy(hidden @ weight.T, labels)`` for [tokens, dim] hidden states and a [vocab, dim]
weight, per provider: ``brickwork`` (``fused_linear_cross_entropy``: Triton on GPU, the torch twin of
the chunk step on CPU), ``brickwork.compile`` (the same call under ``torch.compile``: the loss becomes
a sum of checkpointed chunks that Inductor fuses), ``torch`` (``F.linear`` then ``F.cross_entropy``
on float32 logits, as a model's head and loss do), ``torch.compile`` (that, compiled) and ``liger``
(Liger-Kernel's fused linear cross-entropy, CUDA only, when installed).

The choices behind the fused loss are measured by sweeping them: ``--chunk-size`` takes several
sizes (a brickwork row each), and ``--vocab-multiple M`` gives every provider the weight padded to
a multiple of M rows, as a model with ``vocab_multiple`` holds it (brickwork scores the real
``--vocab`` classes; the torch providers slice the logits to them).

Peak memory is the memory a forward + backward adds on top of its inputs. On CUDA it is
``torch.cuda.max_memory_allocated`` above the allocation before the call. On CPU each provider runs in
a fresh process: the peak resident set (VmHWM, reset through ``/proc/self/clear_refs`` once the
inputs exist) minus the resident set at that moment, so allocator caches of another provider cannot
hide a peak.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from brickwork.kernels import fused_linear_cross_entropy

from .report import device_name, device_slug
from .timing import time_ms

PROVIDERS = ("brickwork", "brickwork.compile", "torch", "torch.compile", "liger")
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
# GPT-2 small's head and a batch of 8 x 1024 tokens on GPU; a CPU run keeps the vocabulary and
# scales the tokens down so that the unfused provider fits comfortably.
GPU_SHAPE = {"tokens": 8192, "dim": 768, "vocab": 50257, "dtype": "bfloat16"}
CPU_SHAPE = {"tokens": 1024, "dim": 768, "vocab": 50257, "dtype": "float32"}

LossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def _unfused(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, vocab: int) -> torch.Tensor:
    return F.cross_entropy(F.linear(hidden, weight)[:, :vocab].float(), labels)


def loss_function(
    provider: str, device: torch.device, chunk_size: int | None = None, vocab: int | None = None
) -> LossFn | None:
    """The loss of ``provider``, or None where it cannot run here (``chunk_size``: brickwork's;
    ``vocab``: the real classes of a weight with padding rows after them, None for none)."""
    if provider in ("brickwork", "brickwork.compile"):

        def fused(h: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return fused_linear_cross_entropy(h, w, y, chunk_size=chunk_size, vocab_size=vocab)

        return fused if provider == "brickwork" else torch.compile(fused)
    if provider in ("torch", "torch.compile"):
        unfused = functools.partial(_unfused, vocab=vocab)
        return unfused if provider == "torch" else torch.compile(unfused)
    if provider == "liger" and device.type == "cuda" and vocab is None:
        try:
            from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
        except ImportError:
            return None
        liger = LigerFusedLinearCrossEntropyLoss()
        return lambda h, w, y: liger(w, h, y)
    return None


def make_inputs(
    tokens: int, dim: int, vocab: int, dtype: torch.dtype, device: torch.device, rows: int | None = None
):
    """hidden [tokens, dim] and weight [rows, dim] (``rows`` >= vocab, zero rows past vocab; default
    vocab), both requiring grad; labels [tokens] below vocab, 1 in 8 ignored."""
    generator = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(tokens, dim, device=device, generator=generator).to(dtype).requires_grad_()
    weight = torch.randn(vocab, dim, device=device, generator=generator).mul_(dim**-0.5).to(dtype)
    weight = F.pad(weight, (0, 0, 0, (rows or vocab) - vocab))
    labels = torch.randint(0, vocab, (tokens,), device=device, generator=generator)
    labels[::8] = -100
    return hidden, weight.requires_grad_(), labels


def _step(fn: LossFn, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> None:
    fn(hidden, weight, labels).backward()


def _resident_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def peak_extra_bytes(fn: LossFn, hidden, weight, labels) -> int:
    """Bytes one forward + backward adds at its peak above what exists before it (see the module doc)."""
    if hidden.is_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        _step(fn, hidden, weight, labels)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # resets the peak resident set (VmHWM) to the current one
    before = _resident_bytes("VmRSS")
    _step(fn, hidden, weight, labels)
    return _resident_bytes("VmHWM") - before


def padded_rows(args: argparse.Namespace) -> int | None:
    """The weight's rows under ``--vocab-multiple`` (None: the vocabulary itself)."""
    multiple = args.vocab_multiple
    return None if multiple is None else -(-args.vocab // multiple) * multiple


def measure(args: argparse.Namespace, provider: str, chunk_size: int | None = None) -> dict | None:
    """One provider in this process: peak extra memory of a first (cold) step, then its time."""
    tokens, dim, vocab, dtype, repeats = args.tokens, args.dim, args.vocab, args.dtype, args.repeats
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = padded_rows(args)
    fn = loss_function(provider, device, chunk_size, vocab if rows is not None else None)
    if fn is None:
        return None
    inputs = make_inputs(tokens, dim, vocab, DTYPES[dtype], device, rows)
    if provider.endswith(".compile"):
        _step(fn, *inputs)  # compile first: the compiler's own memory is not the loss's
    for t in inputs[:2]:
        t.grad = None
    peak = peak_extra_bytes(fn, *inputs)
    if device.type == "cuda":
        ms = time_ms(lambda: _step(fn, *inputs), device, inputs[:2])[0]
    else:
        samples = []
        for _ in range(repeats):
            for t in inputs[:2]:
                t.grad = None
            start = time.perf_counter()
            _step(fn, *inputs)
            samples.append((time.perf_counter() - start) * 1e3)
        ms = sorted(samples)[len(samples) // 2]
    name = provider if chunk_size is None else f"{provider}, chunk {chunk_size}"
    return {"provider": name, "peak_extra_mib": peak / 2**20, "ms": ms}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.fused_linear_cross_entropy", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--providers", nargs="+", choices=PROVIDERS, default=list(PROVIDERS))
    parser.add_argument("--tokens", type=int, help="default 8192 on GPU, 1024 on CPU")
    parser.add_argument("--dim", type=int, help="default 768")
    parser.add_argument("--vocab", type=int, help="default 50257")
    parser.add_argument("--dtype", choices=list(DTYPES), help="default bfloat16 on GPU, float32 on CPU")
    parser.add_argument(
        "--chunk-size",
        type=int,
        nargs="+",
        help="brickwork's tokens per chunk, a row each (default its own)",
        metavar="N",
    )
    parser.add_argument("--vocab-multiple", type=int, help="pad the weight's rows to a multiple of this")
    parser.add_argument("--repeats", type=int, default=3, help="CPU: timed steps (median)")
    parser.add_argument("--threads", type=int, default=1, help="CPU: torch threads")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="results folder")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a CPU child process
    args = parser.parse_args(argv)
    shape = GPU_SHAPE if torch.cuda.is_available() else CPU_SHAPE
    for key in ("tokens", "dim", "vocab", "dtype"):
        if getattr(args, key) is None:
            setattr(args, key, shape[key])
    sizes = [args.tokens, args.dim, args.vocab, args.repeats, args.threads, args.vocab_multiple or 1]
    if min(sizes + (args.chunk_size or [])) < 1:
        parser.error(
            "--tokens, --dim, --vocab, --chunk-size, --vocab-multiple, --repeats and --threads "
            "must be positive"
        )
    return args


def _run_in_child(provider: str, args: argparse.Namespace, chunk_size: int | None) -> dict | None:
    """A provider measured in a fresh interpreter, so that no other provider's memory is resident."""
    command = [sys.executable, "-m", "brickwork.benchmarks.fused_linear_cross_entropy", "--one"]
    command += ["--providers", provider, "--tokens", str(args.tokens), "--dim", str(args.dim)]
    command += ["--vocab", str(args.vocab), "--dtype", args.dtype, "--repeats", str(args.repeats)]
    command += ["--threads", str(args.threads)]
    if chunk_size is not None:
        command += ["--chunk-size", str(chunk_size)]
    if args.vocab_multiple is not None:
        command += ["--vocab-multiple", str(args.vocab_multiple)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"measuring {provider} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def cases(args: argparse.Namespace) -> list[tuple[str, int | None]]:
    """(provider, chunk size) of every row: a brickwork provider once per ``--chunk-size``."""
    chunks = args.chunk_size or [None]
    return [(p, c) for p in args.providers for c in (chunks if p.startswith("brickwork") else [None])]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    gpu = torch.cuda.is_available()
    if not gpu:
        torch.set_num_threads(args.threads)
    if args.one:
        print(json.dumps(measure(args, args.providers[0], (args.chunk_size or [None])[0])))
        return 0
    rows = []
    for provider, chunk_size in cases(args):
        if gpu:
            row = measure(args, provider, chunk_size)
            torch._dynamo.reset()
            torch.cuda.empty_cache()
        else:
            row = _run_in_child(provider, args, chunk_size)
        if row is not None:
            rows.append(row)
    device = device_name(torch.device("cuda" if gpu else "cpu"))
    shape = f"{args.tokens} tokens x dim {args.dim} -> vocab {args.vocab}, {args.dtype}"
    if args.vocab_multiple is not None:
        shape += f", weight padded to {padded_rows(args)} rows"
    lines = [f"Fused linear + cross-entropy, forward + backward, {shape}, {device}", ""]
    lines += ["| provider | peak extra memory, MiB | ms |", "|---|---|---|"]
    lines += [f"| {r['provider']} | {r['peak_extra_mib']:.0f} | {r['ms']:.1f} |" for r in rows]
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"fused_linear_cross_entropy_{device_slug(device)}.json"
    meta = {"device": device, "torch": torch.__version__, "shape": shape, "threads": args.threads}
    meta["chunk_size"] = args.chunk_size
    meta["vocab_multiple"] = args.vocab_multiple
    path.write_text(json.dumps({"metadata": meta, "results": rows}, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
