"""The model-level benchmark of ``brickwork bench``: one training step, brickwork against HF transformers.

For a GPT-2-small-shaped and a Llama-shaped model it builds the HF transformers model with random
weights, converts it with ``brickwork.factory.from_hf`` (identical weights, checked to give the same
logits), and times forward + backward of the token cross-entropy for both, optionally also under
``torch.compile``. CPU runs use fp32; a GPU run uses bf16 weights.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

# The width, depth and heads of GPT-2 small; the Llama shape is Llama's layout at the same scale.
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


def _logits(output: object) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output.logits


def train_step_ms(model: nn.Module, input_ids: torch.Tensor, repeats: int) -> float:
    """Median milliseconds of forward + cross-entropy + backward on ``input_ids`` [B, T]."""

    def step() -> None:
        logits = _logits(model(input_ids))
        F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), input_ids[:, 1:].flatten()).backward()
        model.zero_grad(set_to_none=True)

    times = []
    for i in range(repeats + 2):
        if input_ids.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if input_ids.is_cuda:
            torch.cuda.synchronize()
        if i >= 2:  # two warm-up steps (allocations, compilation)
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def run_case(case: StepCase, layers: int, batch: int, seq: int, repeats: int, compile_too: bool) -> dict:
    """Time one architecture; returns a result row (times in ms, ratio = brickwork / HF)."""
    from brickwork.factory import from_hf

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    hf = case.build_hf(layers).to(device=device, dtype=dtype).eval()
    ours = from_hf(hf)
    input_ids = torch.randint(0, hf.config.vocab_size, (batch, seq), device=device)
    # Same weights, same function: compared without dropout, then both timed in training mode.
    with torch.no_grad():
        diff = (_logits(hf(input_ids)).float() - ours(input_ids).float()).abs().max().item()
    hf.train()
    ours.train()
    row = {
        "model": case.name, "layers": layers, "batch": batch, "seq_len": seq, "device": str(device),
        "dtype": str(dtype).removeprefix("torch."), "max_logit_diff": diff,
        "params": sum(p.numel() for p in ours.parameters()),
    }  # fmt: skip
    row["brickwork_ms"] = train_step_ms(ours, input_ids, repeats)
    row["hf_ms"] = train_step_ms(hf, input_ids, repeats)
    row["ratio"] = row["brickwork_ms"] / row["hf_ms"]
    if compile_too:
        row["brickwork_compiled_ms"] = train_step_ms(torch.compile(ours), input_ids, repeats)
        row["hf_compiled_ms"] = train_step_ms(torch.compile(hf), input_ids, repeats)
        row["compiled_ratio"] = row["brickwork_compiled_ms"] / row["hf_compiled_ms"]
    return row


def markdown_table(rows: list[dict]) -> str:
    """The results as a Markdown table for docs/benchmarks.md."""
    compiled = any("compiled_ratio" in r for r in rows)
    head = ["model", "layers", "batch x seq", "device", "dtype", "brickwork ms", "HF ms", "ratio"]
    if compiled:
        head += ["brickwork compiled ms", "HF compiled ms", "compiled ratio"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], str(r["layers"]), f"{r['batch']} x {r['seq_len']}", r["device"], r["dtype"]]
        cells += [f"{r['brickwork_ms']:.1f}", f"{r['hf_ms']:.1f}", f"{r['ratio']:.2f}"]
        if compiled:
            cells += [
                f"{r['brickwork_compiled_ms']:.1f}",
                f"{r['hf_compiled_ms']:.1f}",
                f"{r['compiled_ratio']:.2f}",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_results(rows: list[dict], out_dir: Path) -> list[Path]:
    """``model_step_<device>.json`` and ``.md`` under ``out_dir`` (named like the kernel results)."""
    from brickwork.benchmarks.report import device_name as name_of
    from brickwork.benchmarks.report import device_slug

    device_name = name_of(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"model_step_{device_slug(device_name)}"
    json_path, md_path = stem.with_suffix(".json"), stem.with_suffix(".md")
    meta = {"device": device_name, "torch": torch.__version__}
    json_path.write_text(json.dumps({"metadata": meta, "results": rows}, indent=2) + "\n")
    md_path.write_text(f"Training step (forward + backward), {device_name}, torch {torch.__version__}\n\n")
    with open(md_path, "a") as handle:
        handle.write(markdown_table(rows))
    return [json_path, md_path]
