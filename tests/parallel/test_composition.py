"""Each apply_* step of parallelize is usable on its own: tensor parallel with activation
checkpointing, and data parallel, each applied by hand and trained by a plain torch loop, give the
single-process losses and weights."""

from __future__ import annotations

import pytest
import torch
from composition_cases import both, odd_sequence_under_sequence_parallel
from parallel_cases import batches, reference

from brickwork.parallel import spawn

pytestmark = [pytest.mark.distributed]


@pytest.mark.timeout(300)
def test_apply_steps_alone_match_one_process() -> None:
    ref = reference("llama")
    for rank_result in spawn(both, 2, "llama", timeout=240):
        assert rank_result["tp"]["sharded"] > 0 and rank_result["dp"]["ddps"] == 1
        for how in ("tp", "dp"):
            result = rank_result[how]
            torch.testing.assert_close(result["losses"], ref["losses"], rtol=1e-5, atol=1e-6)
            assert result["state"].keys() == ref["state"].keys()
            for name, want in ref["state"].items():
                torch.testing.assert_close(result["state"][name], want, rtol=0, atol=1e-5, msg=name)


@pytest.mark.timeout(120)
def test_sequence_parallel_refuses_an_odd_length_on_every_rank() -> None:
    errors = spawn(odd_sequence_under_sequence_parallel, 2, "llama", timeout=90)
    length = batches()[0].shape[2] - 1
    assert length % 2 == 1
    for error in errors:
        assert f"its length {length} must be a multiple of 2" in error, error
