"""The model-level benchmark of ``brickwork bench``: one training step, brickwork against HF transformers.

For a GPT-2-small-shaped and a Llama-shaped model it builds the HF transformers model with random
weights, converts it with ``brickwork.factory.from_hf`` (identical weights, checked to give the same
logits), and times a training step of each variant:

- ``hf`` and ``brickwork``: forward + token cross-entropy + backward, eager;
- ``brickwork, twins``: the same with every kernel call on its torch twin (what the Triton kernels
  change, on a GPU; on CPU the twins run anyway);
- ``brickwork, fused head loss``: the loss from ``hidden_states`` and ``fused_linear_cross_entropy``,
  never materialising the logits;
- ``... + AdamW``: a full step, forward, backward and the optimizer step (fused AdamW on CUDA, the
  default implementation on CPU);
- with ``compile_too``, each of these again under ``torch.compile``; on CUDA also
  ``brickwork, compiled, Triton <kernel>``: the compiled step with that one kernel's modules on the
  registered Triton op instead of the twin that ``backend=None`` compiles (see :func:`triton_kernel`).

Each row gives the wall time of a step (ending in a synchronize) and tokens per second. On CUDA it
also gives the step's device time (GPU-busy time) and host time, measured apart as in the kernel
benchmarks (``timing.time_case``): an eager step whose wall time exceeds its device time is waiting on
the host. CPU runs use float32; a GPU run uses bf16 weights.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from brickwork.components.residual import LayerNorm, RMSNorm
from brickwork.train.losses import logits_of

from .report import device_name, device_slug
from .timing import time_case

# The width, depth and heads of GPT-2 small; the Llama shape is Llama's layout at the same scale.
SPEEDUP_VS_HF = "× faster than HF (higher is better)"
FULL_LAYERS = 12


@dataclass
class StepCase:
    """One architecture to time: its name and a function building the HF model with ``layers`` layers."""

    name: str
    build_hf: Callable[[int], nn.Module]


def gpt2_small(layers: int) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=layers, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257)
    return GPT2LMHeadModel(config)


def llama_shaped(layers: int) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=layers, hidden_size=768, num_attention_heads=12, num_key_value_heads=4,
        intermediate_size=2048, vocab_size=32000, max_position_embeddings=2048, tie_word_embeddings=False,
    )  # fmt: skip
    return LlamaForCausalLM(config)


CASES = (StepCase("gpt2-small", gpt2_small), StepCase("llama-shaped", llama_shaped))


def gpt2_tiny(layers: int) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=32, n_head=4, n_positions=64, vocab_size=97))


def llama_tiny(layers: int) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=layers, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=97, max_position_embeddings=64,
    )  # fmt: skip
    return LlamaForCausalLM(config)


# The same two layouts at width 32: every variant runs in seconds on a CPU, to check the benchmark itself.
TINY_CASES = (StepCase("gpt2-tiny", gpt2_tiny), StepCase("llama-tiny", llama_tiny))


@contextmanager
def torch_twins() -> Iterator[None]:
    """Within this block every kernel call with ``backend=None`` runs its torch twin, on any device."""
    import brickwork.kernels as kernels

    original = kernels.use_triton
    kernels.use_triton = lambda backend, x: backend == "triton" and original(backend, x)
    try:
        yield
    finally:
        kernels.use_triton = original


# The modules that call each kernel and carry its ``backend`` option.
KERNEL_MODULES: dict[str, type[nn.Module]] = {"layer_norm": LayerNorm, "rms_norm": RMSNorm}


def kernels_in(model: nn.Module) -> list[str]:
    """The kernels of :data:`KERNEL_MODULES` that ``model`` calls, in that table's order."""
    return [k for k, cls in KERNEL_MODULES.items() if any(isinstance(m, cls) for m in model.modules())]


@contextmanager
def triton_kernel(model: nn.Module, kernel: str) -> Iterator[None]:
    """Within this block ``model``'s ``kernel`` modules take ``backend="triton"``, so that a compiled
    step runs that kernel as its ``torch.library`` Triton op and every other kernel as its twin."""
    modules = [m for m in model.modules() if isinstance(m, KERNEL_MODULES[kernel])]
    saved = [m.backend for m in modules]
    for module in modules:
        module.backend = "triton"
    try:
        yield
    finally:
        for module, backend in zip(modules, saved, strict=True):
            module.backend = backend


def _logits_loss(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    logits = logits_of(model(input_ids))
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), input_ids[:, 1:].flatten())


def _fused_head_loss(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    from brickwork.kernels import fused_linear_cross_entropy

    hidden = model.hidden_states(input_ids)[:, :-1]
    return fused_linear_cross_entropy(hidden, model.head_weight, input_ids[:, 1:])


def _step_fn(model: nn.Module, input_ids: torch.Tensor, loss_fn, optimizer) -> Callable[[], None]:
    def step() -> None:
        loss_fn(model, input_ids).backward()
        if optimizer is not None:
            optimizer.step()
        model.zero_grad(set_to_none=True)

    return step


def _wall_ms(step: Callable[[], None], cuda: bool, repeats: int) -> float:
    """Median wall milliseconds of ``step`` after two warm-up steps (allocations, compilation)."""
    times = []
    for i in range(repeats + 2):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        if i >= 2:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def time_variant(
    model: nn.Module, input_ids: torch.Tensor, repeats: int, loss_fn=_logits_loss, optimizer=None
) -> dict:
    """Wall ms and tokens/s of one training step; on CUDA also its device (GPU-busy) and host ms."""
    cuda = input_ids.is_cuda
    step = _step_fn(model, input_ids, loss_fn, optimizer)
    wall = _wall_ms(step, cuda, repeats)
    row = {"wall_ms": wall, "tokens_per_s": input_ids.numel() / (wall * 1e-3)}
    if cuda:
        timing = time_case(step, input_ids.device, budget_ms=max(10 * wall, 300.0))
        row |= {"gpu_ms": timing.ms, "host_ms": timing.host_ms}
    return row


def _variants(hf: nn.Module, ours: nn.Module, compile_too: bool, cuda: bool):
    """(name, model, loss, needs optimizer, kernel setting) for every variant to time.

    The setting is a context for the step: ``nullcontext``, :func:`torch_twins`, or (compiled, on
    CUDA, where the Triton ops can compile) :func:`triton_kernel` for one kernel at a time.
    """
    models = [("", hf, ours)]
    if compile_too:
        models.append((", compiled", torch.compile(hf), torch.compile(ours)))
    for suffix, hf_model, our_model in models:
        yield f"hf{suffix}", hf_model, _logits_loss, False, nullcontext
        yield f"brickwork{suffix}", our_model, _logits_loss, False, nullcontext
        yield f"brickwork{suffix}, twins", our_model, _logits_loss, False, torch_twins
        if suffix and cuda:
            for kernel in kernels_in(ours):
                setting = partial(triton_kernel, ours, kernel)
                yield f"brickwork{suffix}, Triton {kernel}", our_model, _logits_loss, False, setting
        if hasattr(ours, "hidden_states"):
            yield f"brickwork{suffix}, fused head loss", our_model, _fused_head_loss, False, nullcontext
        adamw = "fused AdamW" if cuda else "AdamW"
        yield f"hf{suffix} + {adamw}", hf_model, _logits_loss, True, nullcontext
        yield f"brickwork{suffix} + {adamw}", our_model, _logits_loss, True, nullcontext


def _models(
    case: StepCase, layers: int, batch: int, seq: int
) -> tuple[nn.Module, nn.Module, torch.Tensor, dict]:
    """The HF model and its ``from_hf`` twin in training mode, a batch of ids, and the row fields
    they share (shapes, dtype, and the largest logit difference between the two, without dropout)."""
    from brickwork.factory import from_hf

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    hf = case.build_hf(layers).to(device=device, dtype=dtype).eval()
    ours = from_hf(hf)
    input_ids = torch.randint(0, hf.config.vocab_size, (batch, seq), device=device)
    with torch.no_grad():
        diff = (logits_of(hf(input_ids)).float() - ours(input_ids).float()).abs().max().item()
    hf.train()
    ours.train()
    base = {
        "model": case.name, "layers": layers, "batch": batch, "seq_len": seq, "device": str(device),
        "dtype": str(dtype).removeprefix("torch."), "max_logit_diff": diff,
        "params": sum(p.numel() for p in ours.parameters()),
    }  # fmt: skip
    return hf, ours, input_ids, base


def compile_report(case: StepCase, layers: int, batch: int, seq: int) -> list[dict]:
    """What ``torch.compile`` makes of one training step (forward, token loss, backward), HF against
    brickwork: dynamo's graphs and graph breaks, the kernels Inductor generates for the forward and
    backward graphs (Triton kernels on CUDA, C++ ones on CPU), and Inductor's estimate of the bytes
    those kernels move (made for Triton kernels only, so 0 on CPU). Inductor's caches are bypassed so
    that every kernel is generated, and counted, here."""
    from torch._inductor import config as inductor_config
    from torch._inductor import metrics

    hf, ours, input_ids, base = _models(case, layers, batch, seq)
    rows = []
    for variant, model in (("hf", hf), ("brickwork", ours)):
        torch._dynamo.reset()
        explained = torch._dynamo.explain(model)(input_ids)
        torch._dynamo.reset()
        metrics.reset()
        with inductor_config.patch(fx_graph_cache=False):
            _logits_loss(torch.compile(model), input_ids).backward()
        model.zero_grad(set_to_none=True)
        counts = {
            "graphs": explained.graph_count, "graph_breaks": explained.graph_break_count,
            "kernels": metrics.generated_kernel_count, "kernel_bytes": metrics.num_bytes_accessed,
        }  # fmt: skip
        rows.append(base | {"variant": variant} | counts)
    torch._dynamo.reset()
    return rows


def run_case(
    case: StepCase, layers: int, batch: int, seq: int, repeats: int, compile_too: bool
) -> list[dict]:
    """Time every variant of one architecture; one result row per variant."""
    hf, ours, input_ids, base = _models(case, layers, batch, seq)
    cuda = input_ids.is_cuda
    rows = []
    for name, model, loss_fn, with_optimizer, setting in _variants(hf, ours, compile_too, cuda):
        optimizer = None
        if with_optimizer:
            # lr 0 keeps the weights (and so every other variant's numbers) unchanged.
            optimizer = torch.optim.AdamW(model.parameters(), lr=0.0, fused=cuda or None)
        with setting():
            timing = time_variant(model, input_ids, repeats, loss_fn, optimizer)
        rows.append(base | {"variant": name} | timing)
    return rows


def markdown_table(rows: list[dict]) -> str:
    """The results as a Markdown table for docs/benchmarks.md; the speed-up column compares with HF's
    same step (HF's wall time over this row's, as the kernel table's over torch)."""
    gpu = any("gpu_ms" in r for r in rows)
    head = ["model", "variant", "layers", "batch x seq", "dtype", "wall ms", "tokens/s", SPEEDUP_VS_HF]
    if gpu:
        head += ["GPU-busy ms", "host ms", "wall / GPU-busy"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    hf_wall = {
        (r["model"], _hf_twin(r["variant"])): r["wall_ms"] for r in rows if r["variant"].startswith("hf")
    }
    for r in rows:
        reference = hf_wall.get((r["model"], _hf_twin(r["variant"])))
        cells = [r["model"], r["variant"], str(r["layers"]), f"{r['batch']} x {r['seq_len']}", r["dtype"]]
        cells += [f"{r['wall_ms']:.1f}", f"{r['tokens_per_s']:.0f}"]
        cells.append(f"{reference / r['wall_ms']:.2f}" if reference else "-")
        if gpu:
            cells += [f"{r['gpu_ms']:.1f}", f"{r['host_ms']:.1f}", f"{r['wall_ms'] / r['gpu_ms']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _hf_twin(variant: str) -> str:
    """The HF variant a row compares with: same compile and optimizer setting."""
    compiled = ", compiled" if ", compiled" in variant else ""
    optimizer = variant[variant.index(" + ") :] if " + " in variant else ""
    return f"hf{compiled}{optimizer}"


def write_results(rows: list[dict], out_dir: Path) -> list[Path]:
    """``model_step_<device>.json`` and ``.md`` under ``out_dir`` (named like the kernel results)."""
    name = device_name(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"model_step_{device_slug(name)}"
    json_path, md_path = stem.with_suffix(".json"), stem.with_suffix(".md")
    meta = {"device": name, "torch": torch.__version__}
    json_path.write_text(json.dumps({"metadata": meta, "results": rows}, indent=2) + "\n")
    md_path.write_text(f"Training step, {name}, torch {torch.__version__}\n\n" + markdown_table(rows))
    return [json_path, md_path]


def compile_table(rows: list[dict]) -> str:
    """:func:`compile_report`'s rows as a Markdown table."""
    lines = [
        "| model | variant | graphs | graph breaks | Inductor kernels | kernel MB (Inductor's estimate) |"
    ]
    lines.append("|---|---|---|---|---|---|")
    for r in rows:
        cells = [
            r["model"],
            r["variant"],
            r["graphs"],
            r["graph_breaks"],
            r["kernels"],
            r["kernel_bytes"] / 2**20,
        ]
        lines.append("| " + " | ".join(f"{c:.1f}" if isinstance(c, float) else str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.model_step``: the compile report of both architectures (the timed steps
    run through ``brickwork bench``)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.model_step", description=compile_report.__doc__
    )
    parser.add_argument("--layers", type=int, default=FULL_LAYERS)
    parser.add_argument("--batch", type=int, help="default 8 on a GPU, 1 on CPU")
    parser.add_argument("--seq-len", type=int, help="default 1024 on a GPU, 128 on CPU")
    parser.add_argument("--tiny", action="store_true", help="the width-32 cases, to check the report itself")
    parser.add_argument("--out", default="benchmarks/results")
    ns = parser.parse_args(argv)
    gpu = torch.cuda.is_available()
    batch, seq = ns.batch or (8 if gpu else 1), ns.seq_len or (1024 if gpu else 128)
    rows = []
    for case in TINY_CASES if ns.tiny else CASES:
        rows += compile_report(case, ns.layers, batch, seq)
    print(compile_table(rows), end="")
    name = device_name(torch.device("cuda" if gpu else "cpu"))
    out = Path(ns.out) / f"compile_report_{device_slug(name)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"device": name, "torch": torch.__version__}
    out.write_text(json.dumps({"metadata": meta, "results": rows}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
