"""The planner against published runs: the GPT configurations of Table 1 of Narayanan et al. 2021,
"Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM" (SC'21,
arXiv 2104.04473), on A100-80GB nodes of 8 (Selene), vocabulary 51,200, sequence length 2048.

The rows below are the paper's Table 1: attention heads, hidden size, layers, tensor and pipeline
parallel sizes, GPUs, global batch size and the achieved teraFLOP/s per GPU (the paper's FLOP count,
its appendix eq. 3, which includes activation recomputation). The runs used full activation
recomputation and attention over materialized scores (Megatron's fused scale-mask-softmax), so the
specs here use ``scaled_dot_product`` with ``backend: math`` and the paper's layout is priced with
``activation_checkpointing: full``; micro-batch size and schedule, which the table does not give,
are the planner's best for that layout.

Checks: the planner's chosen t × p equals the paper's, or its predicted throughput for the paper's
t × p is within 5% of its own choice; and the predicted TFLOP/s per GPU of the paper's layout is
within 15% of the achieved figure. ``python tests/parallel/planner/test_published_runs.py`` prints the
table docs/parallel.md shows.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from published_runs import GIB, RUNS, Prediction, Run, predict

from brickwork.parallel.planner import Plan, estimate, model_facts, plan


@dataclass(frozen=True)
class PublishedRun:
    billions: float
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    global_batch: int
    tflops: float


TABLE_1 = [
    PublishedRun(1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    PublishedRun(3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    PublishedRun(7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    PublishedRun(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    PublishedRun(39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    PublishedRun(76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    PublishedRun(145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    PublishedRun(310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    PublishedRun(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    PublishedRun(1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]
VOCAB, SEQ = 51200, 2048
# Quick enough for every run of the suite; the whole table is marked slow.
SAMPLE = [TABLE_1[0], TABLE_1[4]]


def gpt_spec(run: PublishedRun) -> dict:
    return {
        "model": "decoder_lm",
        "vocab_size": VOCAB,
        "dim_model": run.hidden,
        "max_seq_len": SEQ,
        "position": {"name": "learned"},
        "decoder": {
            "num_layers": run.layers,
            "block": {
                "attention": {
                    "num_heads": run.heads,
                    "mechanism": {"name": "scaled_dot_product", "backend": "math"},
                },
                "feedforward": {"name": "mlp", "hidden_dim": 4 * run.hidden, "activation": "gelu"},
                "norm": {"name": "layernorm"},
                "residual": {"name": "pre"},
            },
        },
    }


def evaluate(run: PublishedRun) -> tuple[Plan, Plan, Plan, Plan]:
    """(the planner's best without FSDP, its best with the paper's t × p, the paper's t × p with full
    recomputation: ZeRO 0 or 1, whichever is faster, the micro-batch and schedule filled by
    ``estimate``; and the planner's best of all). The paper's software had no FSDP: its choice of
    t × p is compared among the layouts it could run, ZeRO 0 and 1."""
    facts, cluster = model_facts(gpt_spec(run)), f"{run.gpus // 8}x8xA100-80GB"
    every = plan(facts, cluster, global_batch=run.global_batch, seq_len=SEQ)
    plans = [p for p in every if p.dist.get("zero_stage", 0) <= 1]
    paper = [
        p
        for p in plans
        if (p.dist["tensor_parallel_size"], p.dist["pipeline_parallel_size"]) == (run.tp, run.pp)
    ]
    assert paper, f"the paper's layout tp{run.tp} pp{run.pp} does not fit by the model"
    sizes = {
        k: paper[0].dist[k] for k in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
    }
    dist = {**sizes, "sequence_parallel": run.tp > 1, "activation_checkpointing": "full"}
    full = [
        estimate(facts, cluster, {**dist, "zero_stage": zero}, global_batch=run.global_batch, seq_len=SEQ)
        for zero in (0, 1)
    ]
    return plans[0], paper[0], min((p for p in full if p.fits), key=lambda p: p.step_time_s), every[0]


def check(run: PublishedRun) -> None:
    best, paper, full, _ = evaluate(run)
    same = (best.dist["tensor_parallel_size"], best.dist["pipeline_parallel_size"]) == (run.tp, run.pp)
    assert same or paper.tokens_per_s >= 0.95 * best.tokens_per_s, (best.name, paper.name)
    assert abs(full.tflops_per_device / run.tflops - 1) <= 0.15, (full.name, full.tflops_per_device)


@pytest.mark.parametrize("run", SAMPLE, ids=lambda r: f"{r.billions}B")
def test_a_sample_of_table_1(run: PublishedRun) -> None:
    check(run)


@pytest.mark.slow
@pytest.mark.parametrize("run", [r for r in TABLE_1 if r not in SAMPLE], ids=lambda r: f"{r.billions}B")
def test_the_rest_of_table_1(run: PublishedRun) -> None:
    check(run)


def test_the_specs_have_the_papers_parameter_counts() -> None:
    for run in TABLE_1:
        count = model_facts(gpt_spec(run)).num_parameters / 1e9
        assert abs(count / run.billions - 1) < 0.03, (run.billions, count)


def markdown_table() -> str:
    lines = [
        "| model | GPUs | batch | paper t × p | planner's choice (ZeRO 0/1) | paper's t × p: throughput / "
        "choice's | paper TFLOP/s / GPU | predicted (paper's t × p, full recompute) | with FSDP: choice "
        "(throughput / the ZeRO 0/1 choice's) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in TABLE_1:
        best, paper, full, every = evaluate(run)
        lines.append(
            f"| {run.billions}B | {run.gpus} | {run.global_batch} | {run.tp} × {run.pp} | {best.name} | "
            f"{paper.tokens_per_s / best.tokens_per_s:.3f} | {run.tflops:.0f} | "
            f"{full.tflops_per_device:.0f} ({full.tflops_per_device / run.tflops - 1:+.1%}) | "
            f"{every.name} ({every.tokens_per_s / best.tokens_per_s:.3f}) |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())


# The runs of published_runs.py (H100, H200 and A100 runs from Megatron-LM, the Llama 3 paper,
# torchtitan, this project and BLOOM). Where the planner misses a target, the run is named here
# with the reason, and a strict xfail asserts that it still misses (docs/parallel.md discusses each).
RATE_MISSES = {
    # Meta trained without activation checkpointing (Llama 3 paper, section 3.3.2); by the model this
    # layout needs it: without it, 108 GiB a GPU on 8192 GPUs and 92 GiB on 16,384 (docs/parallel.md).
    "Llama 3 405B, 8192 GPUs": "-18%: the model needs full recomputation to fit this layout",
    "Llama 3 405B, 16384 GPUs": "-20%: the model needs full recomputation to fit this layout",
    # torchtitan's 2024 context parallel ran up to 48% slower than the model, more so over more ranks,
    # where without it the same tables are met within 12%; nothing the model prices grows that way
    # (docs/parallel.md).
    "Llama 3.1 8B FSDP 2 CP 4, 131,072 tokens, compiled, Float8": "+42%: torch's 2024 context parallel at 4",
    "Llama 3.1 8B FSDP 1 CP 8, 262,144 tokens, compiled, Float8": "+48%: torch's 2024 context parallel at 8",
    "Llama 3.1 405B TP 8 PP 8 FSDP 4 CP 2, 65,536 tokens, compiled, Float8, async TP": "+26%: the same at 2",
    "Llama 3.1 405B TP 8 PP 8 FSDP 2 CP 4, 131,072 tokens, compiled, Float8, async TP": "+27%: the same at 4",
    "Llama 3.1 405B TP 8 PP 8 FSDP 1 CP 8, 262,144 tokens, compiled, Float8, async TP": "+47%: the same at 8",
    # The H200 takes the H100's fractions; no H200 run fits one of its own (its 64-GPU twin: -14.7%).
    "Llama 3.1 8B FSDP 32, compiled, Float8, H200": "-16%: priced with the H100's achievable fractions",
}
PICK_MISSES = {
    "Llama 3 405B, 8192 GPUs": "context parallel 2 without recomputation, against full recomputation",
    "Llama 3 405B, 16384 GPUs": "context parallel 4 without recomputation, against full recomputation",
    "Llama 3 405B, 16384 GPUs, 131,072 tokens": "context parallel 32 without recomputation, against full",
    # Eager, selective recomputation redoes every element-wise kernel through HBM; a 2-stage pipeline
    # under ZeRO-2 keeps the weights whole but fits without it.
    "Llama 3.1 8B FSDP 8, eager": "pp2 cp2 under ZeRO-2 needs no recomputation, which eager pays per kernel",
    "Llama 3.1 8B FSDP 128, eager": "pp2 under ZeRO-2 needs no recomputation, which eager pays per kernel",
    # torchtitan's own FSDP-only 8B step runs 49% faster a GPU than this TP 8 one (6,514 against 4,378).
    "Llama 3.1 8B FSDP 8 TP 8, compiled": "an async-TP benchmark: FSDP with context parallel is faster",
    "Llama 3.1 70B FSDP 32 TP 8, compiled": "a pipeline with context parallel needs no full recomputation",
    "Llama 3.1 8B FSDP 8 async TP 8, compiled": "an async-TP benchmark: FSDP with context parallel is faster",
    "Llama 3.1 70B FSDP 32 async TP 8, compiled": "a pipeline with context parallel needs no recomputation",
    # The Float8 twins of the rows above, for the same reasons.
    "Llama 3.1 70B FSDP 32 TP 8, compiled, Float8": "a pipeline with CP, no recomputation",
    "Llama 3.1 70B FSDP 32 async TP 8, compiled, Float8": "a pipeline with CP, no recomputation",
    "Llama 3.1 8B FSDP 8 TP 8, compiled, Float8 (2025)": "FSDP with context parallel is faster",
    "Llama 3.1 8B FSDP 8 async TP 8, compiled, Float8 (2025)": "tp2 under ZeRO-2 is faster",
    "Llama 3.1 70B FSDP 32 TP 8, compiled, Float8 (2025)": "a pipeline with CP, no recomputation",
    "Llama 3.1 70B FSDP 32 async TP 8, compiled, Float8 (2025)": "a pipeline with CP, no recomputation",
    # The H200's 141 GB hold the step without recomputation (torchtitan's run used 48 GiB of it).
    "Llama 3.1 8B FSDP 32, compiled, Float8, H200": "ZeRO-2 without recomputation fits an H200",
    "Llama 3.1 8B FSDP 64, compiled, Float8, H200": "ZeRO-2 without recomputation fits an H200",
    # torchtitan benchmarked context parallel against FSDP alone, with full recomputation throughout.
    "Llama 3.1 8B FSDP 8 CP 1, 32,768 tokens, compiled, Float8": "pp2 cp4 needs only selective recomputation",
    # torchtitan's 405B tables show its 3D and 4D layouts at 256 sequences on 512 GPUs, 8 micro-batches
    # on 8 stages: a bubble of nearly half the step under 1F1B, which other layouts avoid.
    **{
        f"Llama 3.1 405B TP 8 PP 8 {shape}, compiled, Float8, async TP": "8 micro-batches on 8 stages"
        for shape in (
            "FSDP 8, 1F1B",
            "FSDP 8, interleaved 1F1B",
            "FSDP 8 CP 1, 32,768 tokens",
            "FSDP 4 CP 2, 65,536 tokens",
            "FSDP 2 CP 4, 131,072 tokens",
            "FSDP 1 CP 8, 262,144 tokens",
        )
    },
    # Korthikanti et al. 2022 measured a 530B GPT 29% faster without full recomputation.
    "BLOOM 176B": "pipelines that need no recomputation (tp4 pp24 dp4, tp8 pp6 dp8: +35%, +30%)",
}
QUICK = {
    "GPT 7.1B",
    "Llama 3.1 8B FSDP 8, compiled",
    "Llama 3.1 8B FSDP 8, compiled, Float8",
    "brickwork gpt2, compiled",
}


@cache
def _predicted(name: str) -> Prediction:
    """One prediction per run, shared by the checks below (a 405B plan takes seconds)."""
    return predict(next(r for r in RUNS if r.name == name))


def _cases(names: set[str] | None = None, quick: bool | None = None) -> list:
    runs = [r for r in RUNS if names is None or r.name in names]
    return [
        pytest.param(r, id=r.name, marks=() if r.name in QUICK else pytest.mark.slow)
        for r in runs
        if quick is None or (r.name in QUICK) == quick
    ]


@pytest.mark.parametrize("run", _cases())
def test_a_published_run(run: Run) -> None:
    """The published layout fits by the model, memory is within 20% of any published figure, the
    reported rate within 15%, and the planner's own best layout is that one or predicted at most 5%
    faster (but for the runs named above)."""
    p = _predicted(run.name)
    assert p.published.fits, p.published.name
    if p.memory_error is not None:
        assert abs(p.memory_error) <= 0.20, p.memory_error
    if p.rate_error is not None and run.name not in RATE_MISSES:
        assert abs(p.rate_error) <= 0.15, (p.published.name, p.rate_error)
    if run.name not in PICK_MISSES:
        assert p.best_over_published <= 0.05, (p.best.name, p.best_over_published)


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="the published runs the planner misses by more than 15% (RATE_MISSES)")
@pytest.mark.parametrize("run", [r for r in RUNS if r.name in RATE_MISSES], ids=lambda r: r.name)
def test_the_rate_misses_still_miss(run: Run) -> None:
    assert abs(_predicted(run.name).rate_error) <= 0.15


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True, reason="the planner's pick is over 5% faster than the published layout (PICK_MISSES)"
)
@pytest.mark.parametrize("run", [r for r in RUNS if r.name in PICK_MISSES], ids=lambda r: r.name)
def test_the_pick_misses_still_miss(run: Run) -> None:
    assert _predicted(run.name).best_over_published <= 0.05


def test_the_llama_405b_layout_fits_once_estimate_fills_its_micro_batching() -> None:
    """The dist dict gives sizes and ZeRO only: estimate picks one sequence per micro-batch, 32 of them
    on the 16 stages, interleaved, and the recomputation that fits."""
    p = _predicted("Llama 3 405B, 8192 GPUs").published
    assert p.fits and p.chosen["micro_batch_size"] == 1 and p.chosen["num_microbatches"] == 32
    assert p.chosen["pipeline_schedule"] == "interleaved_1f1b"


def _docs_rows() -> list[list[str]]:
    """The cells of docs/parallel.md's published-runs table, row by row (its first table after the
    section's heading), minus signs and bold as plain text."""
    text = (Path(__file__).parents[3] / "docs" / "parallel.md").read_text()
    lines = text[text.index("### Against published runs on H100") :].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = list(itertools.takewhile(lambda line: line.startswith("|"), lines[first:]))[2:]
    return [
        [c.strip().replace("**", "").replace("\u2212", "-") for c in row.split("|")[1:-1]] for row in table
    ]


@pytest.mark.slow
def test_the_docs_table_shows_what_the_planner_predicts() -> None:
    """docs/parallel.md's table, row by row in RUNS' order: the predicted rate and its error, the
    predicted memory, and how much faster the planner's pick is, as the planner prints them now."""
    rows = _docs_rows()
    assert len(rows) == len(RUNS)
    for run, cells in zip(RUNS, rows, strict=True):
        p = _predicted(run.name)
        _, gpus, _, _, _, predicted, error, memory, pick = cells
        assert int(gpus) == run.gpus, run.name
        if p.reported is not None:
            assert predicted == f"{p.rate(p.published):,.0f}", run.name
            assert error == f"{p.rate_error:+.1%}", run.name
        if run.memory_gib is not None:
            assert f"/ {p.published.memory_bytes / GIB:.1f} GiB ({p.memory_error:+.0%})" in memory, run.name
        if "(" in pick:
            assert pick.endswith(f"({p.best_over_published:+.1%})"), run.name
