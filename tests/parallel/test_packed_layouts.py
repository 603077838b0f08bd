"""Packed documents train as one process under tensor parallel (heads split over 2 ranks, one block
mask broadcast over them), pipeline parallel (each stage builds the mask of its microbatch) and context
parallel (each rank's rows of the mask over the gathered document ids, positions restarting per
document across the slice boundary): the losses, the weights after, and the eval logits of
FlexAttention (under context parallel its block mask with the query rows shifted)."""

from __future__ import annotations

import pytest
import torch
from document_mask_cases import run_layouts, train_packed

from brickwork.parallel import spawn

pytestmark = [pytest.mark.distributed]

# Rotary with GQA; ALiBi, whose slopes split with the heads; a 2-stage pipeline of the rotary model;
# each position kind (rotary, ALiBi, learned) on two halves of the sequence.
CASES = [
    ("llama/tp2", "llama", {"tensor_parallel_size": 2}),
    ("alibi/tp2", "alibi", {"tensor_parallel_size": 2}),
    ("llama/pp2", "llama", {"pipeline_parallel_size": 2}),
    ("llama/cp2", "llama", {"context_parallel_size": 2}),
    ("alibi/cp2", "alibi", {"context_parallel_size": 2}),
    ("gpt/cp2", "gpt", {"context_parallel_size": 2}),
]


@pytest.mark.timeout(300)
def test_tp2_pp2_and_cp2_packed_equal_one_process() -> None:
    per_rank = spawn(run_layouts, 2, CASES, timeout=240)
    one_process = {kind: train_packed(kind, None) for kind in {kind for _, kind, _ in CASES}}
    for name, kind, _ in CASES:
        want = one_process[kind]
        for rank in per_rank:
            got = rank[name]
            losses = torch.tensor(got["losses"])
            torch.testing.assert_close(losses, torch.tensor(want["losses"]), rtol=0, atol=1e-5, msg=name)
            torch.testing.assert_close(got["logits"], want["logits"], rtol=0, atol=1e-5, msg=name)
            for key, value in want["state"].items():
                torch.testing.assert_close(
                    got["state"][key], value, rtol=1e-5, atol=1e-5, msg=f"{name} {key}"
                )
