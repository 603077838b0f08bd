"""Checkpoints of a packed ``colwise:N`` split (HF GPT-2's fused q|k|v) reshard like any other: saved
at tp=2, loaded in one process, at tp=4 and at dp2×tp2 under ZeRO-3, with the same logits and the
same next step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from packed_checkpoint_cases import batches, build, four_rank, load_run, logits, save_run
from safetensors.torch import load_file

from brickwork.checkpoint import export
from brickwork.checkpoint.safe_reader import read_metadata
from brickwork.parallel import spawn

pytest.importorskip("transformers")
pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict]]:
    root = str(tmp_path_factory.mktemp("packed-tp2"))
    return root, spawn(save_run, 2, root, {"tensor_parallel_size": 2}, timeout=200)


def _same(got: dict, want: dict) -> None:
    torch.testing.assert_close(got["logits"], want["logits"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["next_loss"], want["next_loss"], rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(240)
def test_the_packed_weight_is_stored_in_the_single_process_order(saved: tuple[str, list[dict]]) -> None:
    root, _ = saved
    stored = read_metadata(root).state_dict_metadata["model.transformer.h.0.attn.c_attn.weight"]
    assert tuple(stored.size) == (32, 96)
    # Each of the 2 ranks writes its part of q, of k and of v: 6 chunks of 16 columns, in place.
    assert sorted(tuple(c.offsets) for c in stored.chunks) == [(0, 16 * i) for i in range(6)]


@pytest.mark.timeout(240)
def test_a_tp2_checkpoint_loads_in_one_process(saved: tuple[str, list[dict]], tmp_path: Path) -> None:
    root, ranks = saved
    one = load_run(root, None)
    for rank in ranks:
        _same(one, rank)
    model = build(seed=1)
    model.load_state_dict(load_file(export(root, tmp_path / "gpt2.safetensors")))
    torch.testing.assert_close(logits(model, batches()[0][1]), ranks[0]["logits"], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_tp2_checkpoint_loads_at_tp4_and_under_zero3(saved: tuple[str, list[dict]]) -> None:
    root, ranks = saved
    for rank in spawn(four_rank, 4, root, timeout=240):
        _same(rank["tp4"], ranks[0])
        _same(rank["zero3"], ranks[0])
