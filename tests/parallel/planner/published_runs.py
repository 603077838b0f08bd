"""Published training runs on H100, H200 and A100 GPUs, with the layout, throughput and memory their
sources give, and the planner's prediction for each (docs/parallel.md, "Against published runs").

Sources (numbers copied as published):

- Megatron-LM README, "Performance Benchmarking" (commit f2e5db4, 2024-07-15, Megatron-Core r0.8.0):
  GPT models of 1.7B to 462B parameters, vocabulary 131,072, sequence 4096, up to 6144 H100 GPUs;
  attention heads, hidden size, layers, tensor / pipeline / data parallel sizes, batch size, per-GPU
  teraFLOP/s and MFU (model FLOPs: Megatron's ``num_floating_point_operations``, the whole
  attention square, no recomputation). Run with ``--overlap-grad-reduce --overlap-param-gather
  --tp-comm-overlap``. The table gives neither micro-batch size nor schedule nor recomputation:
  the planner fills them.
- Grattafiori et al. 2024, "The Llama 3 Herd of Models" (arXiv 2407.21783), Table 4: Llama 3 405B
  (126 layers, width 16384, 128 heads, 8 kv heads, feedforward 53248, vocabulary 128,256) on 8192
  and 16,384 H100s, TP 8, PP 16, DP 64 / 128, sequence 8192, 16M tokens a batch, 430 and 400
  TFLOP/s a GPU (43% and 41% BF16 MFU); and its long-context row, 16,384 H100s at TP 8, CP 16, PP 16,
  DP 8, sequence 131,072, 380 TFLOP/s (38%). Meta's FSDP keeps the bf16 weights whole through a step
  and shards the rest: priced as Megatron's distributed optimizer (ZeRO-1), whose fp32 gradients are
  whole on every rank where Meta shards them (docs/parallel.md, the misses).
- torchtitan, benchmarks/llama3_h100_202412_torchtitan.md (2024-12, torchtitan 9dec370),
  benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md and
  benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md: Llama 3.1 8B and 70B in bf16 and Float8,
  with vanilla and async tensor parallel, and the 8B with context parallel over 1 to 8 ranks at
  32,768 to 262,144 tokens (Table 2: local batch 1, full recomputation, Float8; torchtitan's
  context parallel all-gathers the keys and values, its default then), and the 405B over TP 8 and
  PP 8 (Tables 5 and 6), priced with torchtitan's defaults of the time for what the benchmark does
  not state (``_titan_405b``). Their H100s are 96 GB
  HBM2e boards at 500 W, "between SXM and NVL" in peak: described here as 95 GiB, 2.4 TB/s and 912
  dense bf16 TFLOP/s, midway between the SXM's 989 and the NVL's 835. Tokens per second per GPU;
  memory as torchtitan reports it (GiB).
- This project's own measurement (shared perf file h100-2026-11-27): a plain compiled
  nanoGPT-structured GPT-2 small (no dropout, tied head, tanh-GELU) on one H100 80GB HBM3, 16 × 1024
  tokens a step, bf16 autocast: 422k–427k tokens/s, peak 8.5 GiB; and brickwork's ``gpt2`` preset
  (dropout 0.1) in the same loop, compiled, with its fused head loss: 338k tokens/s, 8.9 GiB. The
  same plain loop compiled on one H200 (benchmarks/results/train_gpu_NVIDIA_H200.json, torch 2.11):
  450,655 tokens/s (446,114 in a second run on another machine).
- BigScience BLOOM-176B (bigscience-workshop/bigscience, train/tr11-176B-ml/README.md and the
  BigScience 176B model summary): 70 layers, width 14336, 112 heads, vocabulary 250,880 (tied),
  ALiBi, sequence 2048; 384 A100-80GB, TP 4, PP 12, DP 8, micro-batch 2, global batch 2048,
  ZeRO-1 (DeepSpeed's BF16_Optimizer), full recomputation (``--deepspeed-activation-checkpointing``)
  over Megatron's fused softmax; 19.561 samples/s at the end of the first epoch, and "60 GB of memory
  on each GPU".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from brickwork.parallel.planner import Plan, estimate, model_facts, parse_cluster, plan

GIB = 1024**3


def gpt(hidden: int, heads: int, layers: int, vocab: int, seq: int, **options: Any) -> dict[str, Any]:
    """A GPT decoder: learned positions, LayerNorm, a 4h GELU MLP, pre-norm; untied unless said."""
    mechanism = {"name": "scaled_dot_product", "backend": options.get("backend", "sdpa")}
    return {
        "model": "decoder_lm",
        "vocab_size": vocab,
        "dim_model": hidden,
        "max_seq_len": seq,
        "position": {"name": options.get("position", "learned")},
        "tie_embeddings": options.get("tied", False),
        "decoder": {
            "num_layers": layers,
            "block": {
                "attention": {"num_heads": heads, "mechanism": mechanism},
                "feedforward": {
                    "name": "mlp",
                    "hidden_dim": 4 * hidden,
                    "activation": options.get("act", "gelu"),
                },
                "norm": {"name": "layernorm"},
                "residual": {"name": "pre"},
            },
        },
    }


def llama(hidden: int, heads: int, layers: int, ffn: int, seq: int = 8192) -> dict[str, Any]:
    """A Llama 3 decoder: rotary, RMSNorm, SwiGLU, 8 kv heads, vocabulary 128,256, untied."""
    return {
        "model": "decoder_lm",
        "vocab_size": 128256,
        "dim_model": hidden,
        "max_seq_len": seq,
        "position": {"name": "rotary", "base": 500000.0},
        "tie_embeddings": False,
        "decoder": {
            "num_layers": layers,
            "block": {
                "attention": {"num_heads": heads, "num_kv_heads": 8, "bias": False},
                "feedforward": {"name": "swiglu", "hidden_dim": ffn, "bias": False},
                "norm": {"name": "rmsnorm"},
                "residual": {"name": "pre"},
            },
        },
    }


def torchtitan_gpus(count: int) -> list[dict[str, Any]]:
    return [
        {
            "preset": "H100-80GB",
            "name": "H100-96GB",
            "memory_gib": 95,
            "memory_gbps": 2400,
            "bf16_tflops": 912,
            "fp8_tflops": 1824,
            "node": rank // 8,
        }
        for rank in range(count)
    ]


@dataclass(frozen=True)
class Run:
    """One published run: its model, devices, layout (the dist keys its source states), batch and
    sequence, the implementation that ran it (implementations.py), and what it reported: model
    TFLOP/s per GPU (``tflops``) or tokens/s per GPU (``tokens_per_gpu``), and memory per GPU."""

    name: str
    source: str
    spec: dict[str, Any] | str
    cluster: str | list[dict[str, Any]]
    dist: dict[str, Any]
    global_batch: int
    seq_len: int
    implementation: str
    tflops: float | None = None
    tokens_per_gpu: float | None = None
    memory_gib: float | None = None
    step: dict[str, Any] = field(default_factory=dict)  # micro-batching the source states
    precision: str = "bf16-mixed"

    @property
    def gpus(self) -> int:
        return parse_cluster(self.cluster).world_size


def _megatron(
    billions: str,
    heads: int,
    hidden: int,
    layers: int,
    tp: int,
    pp: int,
    gpus: int,
    batch: int,
    tflops: float,
) -> Run:
    dist = {
        "tensor_parallel_size": tp,
        "pipeline_parallel_size": pp,
        "data_parallel_size": gpus // (tp * pp),
        "sequence_parallel": tp > 1,
        "zero_stage": 1,
    }
    return Run(
        f"GPT {billions}",
        "Megatron-LM README",
        gpt(hidden, heads, layers, 131072, 4096),
        f"{gpus // 8}x8xH100-80GB",
        dist,
        batch,
        4096,
        "megatron",
        tflops=tflops,
    )


def _llama405(gpus: int, tflops: float, seq: int = 8192, cp: int = 1) -> Run:
    """A row of Table 4: 16M tokens a step, in sequences of ``seq`` tokens over ``cp`` ranks."""
    dist = {
        "tensor_parallel_size": 8,
        "context_parallel_size": cp,
        "pipeline_parallel_size": 16,
        "data_parallel_size": gpus // (128 * cp),
        "sequence_parallel": True,
        "zero_stage": 1,
    }
    return Run(
        f"Llama 3 405B, {gpus} GPUs" + (f", {seq:,} tokens" if seq != 8192 else ""),
        "Llama 3 paper, Table 4",
        llama(16384, 128, 126, 53248, seq),
        f"{gpus // 8}x8xH100-80GB",
        dist,
        2048 * 8192 // seq,
        seq,
        "megatron",
        tflops=tflops,
    )


def _titan_implementation(name: str) -> str:
    """The implementation (implementations.py) a torchtitan row ran, by what its name says: eager,
    async TP, Trainy's H200 run (FSDP's float8 gathers), a June 2025 row, or the December 2024 one."""
    if name.endswith("eager"):
        return "torchtitan_eager"
    if "async" in name:
        return "torchtitan_async_tp"
    if "H200" in name:
        return "torchtitan_float8_all_gather"
    return "torchtitan_2025" if "2025" in name else "torchtitan"


def _titan(
    name: str,
    spec: dict[str, Any],
    gpus: int,
    tp: int,
    rows: int,
    recompute: str,
    tokens: float,
    memory: float | None = None,
    cluster: str | None = None,
    cp: int = 1,
    seq: int = 8192,
) -> Run:
    """A torchtitan row, on torchtitan's own H100s unless ``cluster`` says; an eager one (its name
    says) is priced without torch.compile's fusion, an async TP one with its tensor-parallel traffic
    beside the matmuls, a Float8 one at fp8, the H200 ones (Trainy's) with FSDP's float8 gathers.
    ``rows`` sequences of ``seq`` tokens a data-parallel rank, each split over ``cp`` context-parallel
    ranks."""
    dp = gpus // (tp * cp)
    dist = {
        "data_parallel_size": dp,
        "context_parallel_size": cp,
        "tensor_parallel_size": tp,
        "sequence_parallel": tp > 1,
        "zero_stage": 3,
        "activation_checkpointing": recompute,
    }
    return Run(
        name,
        "torchtitan benchmarks",
        spec,
        cluster or torchtitan_gpus(gpus),
        dist,
        rows * dp,
        seq,
        _titan_implementation(name),
        tokens_per_gpu=tokens,
        memory_gib=memory,
        step={"grad_accum_steps": 1},
        precision="fp8" if "Float8" in name else "bf16-mixed",
    )


def _titan_405b(schedule: str, tokens: float, memory: float, cp: int = 0) -> Run:
    """torchtitan's Llama 3.1 405B on 512 of its H100s, TP 8 and PP 8 with FSDP over the rest, full
    recomputation, Float8 and async TP, compiled: its 3D rows (Table 5: 8192 tokens, local batch 32, by
    ``schedule``) or, with ``cp``, its 4D ones (Table 6: 32,768 × cp tokens over ``cp``
    context-parallel ranks, local batch 8, 1F1B). The micro-batches are torchtitan's default then, as
    many as pipeline ranks, and the interleaved schedule its default 2 stages per rank
    (parallelisms/pipelining_utils.py at 9dec370); FSDP in a pipeline keeps the weights whole between
    micro-batches (ZeRO-2 here)."""
    seq, rows = (32768 * cp, 8) if cp else (8192, 32)
    dp = 512 // (64 * max(cp, 1))
    dist = {
        "data_parallel_size": dp,
        "context_parallel_size": max(cp, 1),
        "tensor_parallel_size": 8,
        "pipeline_parallel_size": 8,
        "sequence_parallel": True,
        "zero_stage": 2,
        "activation_checkpointing": "full",
        "pipeline_schedule": schedule,
        "virtual_pipeline_size": 2 if schedule == "interleaved_1f1b" else 1,
        "num_microbatches": 8,
    }
    named = {"1f1b": "1F1B", "interleaved_1f1b": "interleaved 1F1B"}[schedule]
    shape = f"FSDP {dp} CP {cp}, {seq:,} tokens" if cp else f"FSDP 8, {named}"
    return Run(
        f"Llama 3.1 405B TP 8 PP 8 {shape}, compiled, Float8, async TP",
        "torchtitan benchmarks",
        llama(16384, 128, 126, 53248, seq),
        torchtitan_gpus(512),
        dist,
        rows * dp,
        seq,
        "torchtitan_async_tp",
        tokens_per_gpu=tokens,
        memory_gib=memory,
        step={"micro_batch_size": rows // 8},
        precision="fp8",
    )


def _one_gpu(
    name: str,
    implementation: str,
    tokens: float | None = None,
    memory: float | None = None,
    device: str = "H100-80GB",
) -> Run:
    """GPT-2 small on one GPU, 16 × 1024 tokens a step: the plain loop's model (no dropout, tanh-GELU,
    tied head) or brickwork's ``gpt2`` preset."""
    spec = gpt(768, 12, 12, 50257, 1024, tied=True, act="gelu_tanh") if implementation == "plain" else "gpt2"
    source = f"this project, {device.split('-')[0]} 2026-11-27"
    return Run(
        name,
        source,
        spec,
        device,
        {},
        16,
        1024,
        implementation,
        tokens_per_gpu=tokens,
        memory_gib=memory,
        step={"grad_accum_steps": 1},
    )


def _bloom() -> Run:
    spec = gpt(14336, 112, 70, 250880, 2048, tied=True, backend="math", position="alibi")
    dist = {
        "tensor_parallel_size": 4,
        "pipeline_parallel_size": 12,
        "data_parallel_size": 8,
        "zero_stage": 1,
        "activation_checkpointing": "full",
    }
    return Run(
        "BLOOM 176B",
        "BigScience tr11-176B-ml",
        spec,
        "48x8xA100-80GB",
        dist,
        2048,
        2048,
        "deepspeed",
        tokens_per_gpu=19.561 * 2048 / 384,
        memory_gib=60e9 / GIB,
        step={"micro_batch_size": 2},
    )


LLAMA_8B, LLAMA_70B = llama(4096, 32, 32, 14336), llama(8192, 64, 80, 28672)

RUNS = [
    _megatron("1.7B", 16, 2048, 24, 1, 1, 48, 192, 408.8),
    _megatron("7.1B", 32, 4096, 30, 2, 1, 96, 192, 465.9),
    _megatron("16B", 48, 6144, 32, 4, 1, 192, 192, 489.1),
    _megatron("32B", 56, 7168, 48, 8, 1, 384, 192, 459.6),
    _megatron("70B", 64, 8192, 84, 8, 2, 768, 384, 419.7),
    _megatron("119B", 80, 10240, 92, 8, 4, 1536, 768, 420.5),
    _megatron("177B", 96, 12288, 96, 8, 6, 2304, 1152, 432.8),
    _megatron("314B", 128, 16384, 96, 8, 8, 3072, 1536, 474.4),
    _megatron("462B", 144, 18432, 112, 8, 16, 6144, 3072, 459.9),
    _llama405(8192, 430),
    _llama405(16384, 400),
    _llama405(16384, 380, seq=131072, cp=16),
    _titan("Llama 3.1 8B FSDP 8, compiled", LLAMA_8B, 8, 1, 2, "selective", 6667, 77.0),
    _titan("Llama 3.1 8B FSDP 8, eager", LLAMA_8B, 8, 1, 2, "selective", 5762, 82.4),
    _titan("Llama 3.1 8B FSDP 128, compiled", LLAMA_8B, 128, 1, 2, "selective", 6514, 62.0),
    _titan("Llama 3.1 8B FSDP 128, eager", LLAMA_8B, 128, 1, 2, "selective", 5605, 67.0),
    _titan("Llama 3.1 8B FSDP 8 TP 8, compiled", LLAMA_8B, 64, 8, 12, "selective", 4378),
    _titan("Llama 3.1 70B FSDP 32 TP 8, compiled", LLAMA_70B, 256, 8, 16, "full", 597.3),
    _titan("Llama 3.1 8B FSDP 8 async TP 8, compiled", LLAMA_8B, 64, 8, 12, "selective", 4809.4),
    _titan("Llama 3.1 70B FSDP 32 async TP 8, compiled", LLAMA_70B, 256, 8, 16, "full", 652.4),
    _titan("Llama 3.1 8B FSDP 8, compiled, Float8", LLAMA_8B, 8, 1, 2, "selective", 8532, 76.8),
    _titan("Llama 3.1 8B FSDP 128, compiled, Float8", LLAMA_8B, 128, 1, 2, "selective", 8380, 61.8),
    _titan("Llama 3.1 70B FSDP 32 TP 8, compiled, Float8", LLAMA_70B, 256, 8, 16, "full", 829, 71.9),
    _titan("Llama 3.1 70B FSDP 32 async TP 8, compiled, Float8", LLAMA_70B, 256, 8, 16, "full", 876, 67.6),
    _titan("Llama 3.1 8B FSDP 8 TP 8, compiled, Float8 (2025)", LLAMA_8B, 64, 8, 12, "selective", 5078.1),
    _titan(
        "Llama 3.1 8B FSDP 8 async TP 8, compiled, Float8 (2025)", LLAMA_8B, 64, 8, 12, "selective", 5570.1
    ),
    _titan("Llama 3.1 70B FSDP 32 TP 8, compiled, Float8 (2025)", LLAMA_70B, 256, 8, 16, "full", 809.8),
    _titan("Llama 3.1 70B FSDP 32 async TP 8, compiled, Float8 (2025)", LLAMA_70B, 256, 8, 16, "full", 942.4),
    _titan(
        "Llama 3.1 8B FSDP 32, compiled, Float8, H200",
        LLAMA_8B,
        32,
        1,
        2,
        "selective",
        10938,
        47.96,
        "4x8xH200",
    ),
    _titan(
        "Llama 3.1 8B FSDP 64, compiled, Float8, H200",
        LLAMA_8B,
        64,
        1,
        2,
        "selective",
        10753,
        46.97,
        "8x8xH200",
    ),
    *(
        _titan(
            f"Llama 3.1 8B FSDP {8 // cp} CP {cp}, {8192 * 4 * cp:,} tokens, compiled, Float8",
            llama(4096, 32, 32, 14336, 8192 * 4 * cp),
            8,
            1,
            1,
            "full",
            tokens,
            memory,
            cp=cp,
            seq=8192 * 4 * cp,
        )
        for cp, tokens, memory in ((1, 3890, 83.9), (2, 2540, 84.2), (4, 1071, 84.0), (8, 548, 84.5))
    ),
    _titan_405b("1f1b", 100, 82.5),
    _titan_405b("interleaved_1f1b", 128, 72.7),
    *(
        _titan_405b("1f1b", tokens, memory, cp)
        for cp, tokens, memory in ((1, 76, 75.3), (2, 47, 75.9), (4, 31, 77.1), (8, 16, 84.9))
    ),
    _one_gpu("GPT-2 small, plain loop, compiled", "plain", tokens=425_000),
    _one_gpu("GPT-2 small, plain loop, eager", "plain", memory=16.0),
    _one_gpu("brickwork gpt2, compiled", "brickwork", tokens=338_000, memory=8.9),
    _one_gpu("GPT-2 small, plain loop, compiled, H200", "plain", tokens=450_655, device="H200"),
    _bloom(),
]


@dataclass(frozen=True)
class Prediction:
    """The planner on one run: its estimate of the published layout, and its own best layout."""

    run: Run
    published: Plan
    best: Plan

    def rate(self, p: Plan) -> float:
        """What the run reported, predicted for ``p``: model TFLOP/s per GPU or tokens/s per GPU."""
        if self.run.tflops is not None:
            return p.mfu * parse_cluster(self.run.cluster).devices[0].peak_flops("bf16") / 1e12
        return p.tokens_per_s / self.run.gpus

    @property
    def reported(self) -> float | None:
        return self.run.tflops if self.run.tflops is not None else self.run.tokens_per_gpu

    @property
    def rate_error(self) -> float | None:
        return None if self.reported is None else self.rate(self.published) / self.reported - 1

    @property
    def memory_error(self) -> float | None:
        if self.run.memory_gib is None:
            return None
        return self.published.memory_bytes / (self.run.memory_gib * GIB) - 1

    @property
    def best_over_published(self) -> float:
        """How much faster the planner's own pick is predicted than the published layout."""
        return self.published.step_time_s / self.best.step_time_s - 1


def predict(run: Run) -> Prediction:
    facts = model_facts(run.spec)
    options = {
        "global_batch": run.global_batch,
        "seq_len": run.seq_len,
        "implementation": run.implementation,
        "precision": run.precision,
    }
    published = estimate(facts, run.cluster, run.dist, **options, **run.step)
    best = plan(facts, run.cluster, **options, grad_accum_steps=run.step.get("grad_accum_steps"))[0]
    return Prediction(run, published, best)


def markdown_table(runs: list[Run]) -> str:
    lines = [
        "| run | GPUs | published layout | planner fills | reported | predicted | error | memory: reported / "
        "predicted | planner's pick (faster by) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        p = predict(run)
        unit = "TFLOP/s" if run.tflops is not None else "tokens/s"
        rate = "- | - | -"
        if p.reported is not None:
            rate = f"{p.reported:,.0f} {unit} | {p.rate(p.published):,.0f} | {p.rate_error:+.1%}"
        memory = (
            ""
            if run.memory_gib is None
            else f"{run.memory_gib:.1f} / {p.published.memory_bytes / GIB:.1f} GiB "
        )
        memory += "" if p.memory_error is None else f"({p.memory_error:+.0%})"
        filled = ", ".join(f"{k} {v}" for k, v in p.published.chosen.items()) or "-"
        lines.append(
            f"| {run.name} | {run.gpus} | {p.published.name} | {filled} | {rate} | {memory or '-'} | "
            f"{p.best.name} ({p.best_over_published:+.1%}) |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table(RUNS))
