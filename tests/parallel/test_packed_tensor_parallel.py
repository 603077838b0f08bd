"""Packed documents under tensor parallel (heads split over 2 ranks, one block mask broadcast over
them) train as one process: the losses, the weights after, and the eval logits of FlexAttention."""

from __future__ import annotations

import pytest
import torch
from document_mask_cases import run_tensor_parallel, train_packed

from brickwork.parallel import spawn

pytestmark = [pytest.mark.distributed]

KINDS = ["llama", "alibi"]  # rotary with GQA; ALiBi, whose slopes split with the heads


@pytest.mark.timeout(300)
def test_tp2_packed_equals_one_process() -> None:
    per_rank = spawn(run_tensor_parallel, 2, KINDS, timeout=240)
    for kind in KINDS:
        want = train_packed(kind, None)
        for rank in per_rank:
            got = rank[kind]
            torch.testing.assert_close(
                torch.tensor(got["losses"]), torch.tensor(want["losses"]), rtol=0, atol=1e-5
            )
            torch.testing.assert_close(got["logits"], want["logits"], rtol=0, atol=1e-5)
            for name, value in want["state"].items():
                torch.testing.assert_close(got["state"][name], value, rtol=1e-5, atol=1e-5, msg=name)
