"""What the planner calls infeasible really does not fit, and what it chooses runs: one training step
on CPU under an address-space cap (RLIMIT_AS) set to the device memory the planner was told.

The child processes run with glibc's ``MALLOC_MMAP_THRESHOLD_`` pinned at 64 KiB, so every tensor
buffer is mapped on its own and unmapped when freed. By default glibc raises that threshold as
blocks are freed and then serves tensors from its heap, which keeps freed blocks mapped: the same
step then needs about 1.5× the address space (measured peak RSS of the chosen layout: 90 MiB with the
default, 51 MiB pinned, against 65 MiB predicted).
"""

from __future__ import annotations

import pytest
from planner_cases import gpt_spec, step_under_cap

from brickwork.parallel import estimate, plan, spawn

ROWS, SEQ, LAYERS = 16, 256, 8
DEVICE_MIB = 72


def cpu(memory_mib: int) -> list[dict]:
    return [{"name": "cpu", "memory_gib": memory_mib / 1024, "bf16_tflops": 0.05, "triton_kernels": False}]


def spec() -> dict:
    s = gpt_spec(layers=LAYERS)
    s["max_seq_len"] = SEQ
    return s


@pytest.mark.slow
def test_an_infeasible_layout_runs_out_of_memory_and_the_chosen_one_runs(monkeypatch) -> None:
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(64 * 1024))  # read by each spawned child's glibc
    cluster = cpu(DEVICE_MIB)
    options = {"global_batch": ROWS, "seq_len": SEQ, "precision": "fp32"}
    # All 16 rows at once, nothing recomputed: fixed, so estimate prices it as given.
    whole = estimate(spec(), cluster, {"activation_checkpointing": "none"}, grad_accum_steps=1, **options)
    assert not whole.fits and whole.memory_bytes > 1.5 * whole.device_memory_bytes
    chosen = plan(spec(), cluster, **options)[0]
    assert chosen.fits
    device_bytes = DEVICE_MIB * 1024**2
    [outcome] = spawn(step_under_cap, 1, spec(), {}, ROWS, 1, device_bytes, timeout=300)
    assert outcome == "out of memory"
    [outcome] = spawn(
        step_under_cap, 1, spec(), chosen.dist, ROWS, chosen.grad_accum_steps, device_bytes, timeout=300
    )
    assert outcome == "ok", chosen.name
