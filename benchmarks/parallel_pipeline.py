"""Pipeline bubbles and activation memory of GPipe, 1F1B and interleaved 1F1B, measured on CPU/gloo.

Run ``python -m benchmarks.parallel_pipeline`` (or ``python benchmarks/parallel_pipeline.py``). For
p = 2 and p = 4 pipeline processes, one spec-built GPT is trained under each schedule; every
PipelineStage's ``forward_one_chunk`` and ``backward_one_chunk`` is timed, and:

- bubble = 1 - (time spent computing) / (wall time of the train step), averaged over the ranks; the
  theory is (p-1)/(m+p-1) for GPipe and 1F1B, and for interleaved 1F1B with v stages per rank
  (p-1)/(v·m) of the ideal time, i.e. (p-1)/(v·m+p-1) of the step;
- in flight = the most microbatches whose forward ran and whose backward has not, on rank 0 (GPipe
  holds m, 1F1B at most p); saved activations = the peak bytes autograd keeps for backward on rank 0,
  parameters excluded, via ``torch.autograd.graph.saved_tensors_hooks``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from brickwork.factory import build_model, get_preset
from brickwork.parallel import parallelize, spawn
from brickwork.train import TrainStep

LAYERS, DIM, HEADS, VOCAB, SEQ, ROWS, MICROBATCHES, STEPS = 8, 256, 8, 256, 128, 2, 8, 3


def spec() -> dict[str, Any]:
    s = copy.deepcopy(get_preset("gpt-tiny"))
    s.update(vocab_size=VOCAB, dim_model=DIM, max_seq_len=SEQ)
    s["decoder"]["num_layers"] = LAYERS
    s["decoder"]["block"]["attention"]["num_heads"] = HEADS
    s["decoder"]["block"]["feedforward"]["hidden_dim"] = 4 * DIM
    return s


class Probe:
    """Times the stages' compute and follows microbatches in flight and saved activation bytes."""

    def __init__(self, parameters: list[torch.Tensor]) -> None:
        self.busy = 0.0
        self.in_flight = self.peak_in_flight = 0
        self.saved = self.peak_saved = 0
        self._param_storage = {p.untyped_storage().data_ptr() for p in parameters}

    def wrap(self, stage: Any) -> None:
        for name, delta in (("forward_one_chunk", 1), ("backward_one_chunk", -1)):
            setattr(stage, name, self._timed(getattr(stage, name), delta))

    def _timed(self, fn: Any, delta: int) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            self.busy += time.perf_counter() - start
            self.in_flight += delta
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            return out

        return run

    def pack(self, tensor: torch.Tensor) -> Any:
        if tensor.untyped_storage().data_ptr() in self._param_storage:
            return tensor
        return _Saved(self, tensor)

    @staticmethod
    def unpack(packed: Any) -> torch.Tensor:
        return packed.tensor if isinstance(packed, _Saved) else packed


class _Saved:
    """A saved activation; its bytes count until autograd frees it."""

    def __init__(self, probe: Probe, tensor: torch.Tensor) -> None:
        self.probe, self.tensor = probe, tensor
        self.bytes = tensor.numel() * tensor.element_size()
        probe.saved += self.bytes
        probe.peak_saved = max(probe.peak_saved, probe.saved)

    def __del__(self) -> None:
        self.probe.saved -= self.bytes


def measure(schedule: str, virtual: int) -> dict[str, Any]:
    """On each rank: one warm-up step, then STEPS measured steps."""
    p = dist.get_world_size()
    torch.manual_seed(0)
    layout = {
        "pipeline_parallel_size": p,
        "pipeline_schedule": schedule,
        "virtual_pipeline_size": virtual,
        "num_microbatches": MICROBATCHES,
        "pipeline_layers": [LAYERS // (p * virtual)] * (p * virtual),
    }
    pm = parallelize(build_model(spec()), layout)
    opt = torch.optim.SGD(pm.parameters(), lr=1e-3)
    ids = torch.randint(0, VOCAB, (ROWS * MICROBATCHES, SEQ), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": ids}  # HF's causal-LM labels: shifted inside
    step = TrainStep(pm, opt, "causal_lm")
    step(batch)
    probe = Probe(list(pm.parameters()))
    for stage in pm.pipeline_stages:
        probe.wrap(stage)
    bubbles = []
    for _ in range(STEPS):
        probe.busy = 0.0
        dist.barrier()
        start = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(probe.pack, probe.unpack):
            step(batch)
        bubbles.append(1.0 - probe.busy / (time.perf_counter() - start))
    return {
        "bubble": statistics.median(bubbles),
        "peak_in_flight": probe.peak_in_flight,
        "peak_saved_bytes": probe.peak_saved,
    }


def theory(schedule: str, p: int, v: int, m: int) -> tuple[float, int]:
    """Bubble as a fraction of the step, and the microbatches rank 0 holds at most."""
    if schedule == "interleaved_1f1b":
        return (p - 1) / (v * m + p - 1), min(v * m, (v - 1) * p + 2 * (p - 1) + 1)
    return (p - 1) / (m + p - 1), (m if schedule == "gpipe" else min(m, p))


def table(rows: list[dict[str, Any]]) -> str:
    m = MICROBATCHES
    lines = [
        f"GPT from the gpt-tiny preset, {LAYERS} layers, d={DIM}, T={SEQ}, m={m} microbatches of {ROWS} "
        f"rows, fp32, gloo, one CPU thread per process; median of {STEPS} steps.",
        "",
        "| schedule | p | v | bubble measured | bubble theory | (p−1)/(v·m) | in flight, rank 0 | "
        "theory | saved activations, rank 0 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        frac, flight = theory(r["schedule"], r["p"], r["v"], m)
        ratio = f"{(r['p'] - 1) / (r['v'] * m):.3f}" if r["schedule"] == "interleaved_1f1b" else "–"
        lines.append(
            f"| {r['schedule']} | {r['p']} | {r['v']} | {r['bubble']:.3f} | {frac:.3f} | {ratio} | "
            f"{r['peak_in_flight']} | {flight} | {r['peak_saved_bytes'] / 2**20:.1f} MiB |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2,4", help="pipeline sizes p to measure (comma-separated)")
    parser.add_argument("--json", help="also write the raw numbers to this file")
    args = parser.parse_args(argv)
    rows = []
    for p in (int(s) for s in args.sizes.split(",")):
        for schedule, virtual in (("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)):
            print(f"measuring {schedule} p={p} v={virtual} ...", flush=True)
            per_rank = spawn(measure, p, schedule, virtual, timeout=600)
            bubble = statistics.mean(r["bubble"] for r in per_rank)
            rows.append({"schedule": schedule, "p": p, "v": virtual, **per_rank[0], "bubble": bubble})
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
