"""Every check a run's config can fail comes before the run touches the disk: a refused start leaves
the folder exactly as it was (no runs/, no run folder, no token cache)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from brickwork.cli import main


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


REFUSALS = [
    (
        ["train.grad_accum_steps=3", "train.batch_size=8"],
        "train.batch_size: 8 rows do not split into grad_accum_steps=3 micro-batches",
    ),
    (["data.path=nope.txt"], "data.path: file or folder 'nope.txt' does not exist"),
    (["data.tokenizer=nope.json"], "data.tokenizer: "),
    (["data.path=empty.txt"], "data.path: file 'empty.txt' is empty"),
    (["vocab_size=100"], "vocab_size: 100 is smaller than the 256 ids of the data"),
    (["dist.tensor_parallel_size=2"], "asks for 2 processes"),
    (["train.seq_len=512"], "train.seq_len: 512 is longer than max_seq_len=256"),
    (["train.out_dir=deep/er/run", "data.path=empty.txt"], "data.path: file 'empty.txt' is empty"),
]


@pytest.mark.parametrize(("overrides", "expected"), REFUSALS, ids=[" ".join(o) for o, _ in REFUSALS])
def test_a_refused_start_leaves_the_disk_as_it_was(capsys, tmp_path, monkeypatch, overrides, expected):
    monkeypatch.chdir(tmp_path)
    Path("empty.txt").write_text("")
    before = listing(tmp_path)
    assert main(["train", "train.steps=2", *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and "\n" not in err
    assert listing(tmp_path) == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a usable CUDA device")
def test_cuda_without_a_device_is_refused_before_runs_exists(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "train.steps=2", "train.device=cuda"]) == 2
    assert "train.device: cuda, but no CUDA device is usable here" in capsys.readouterr().err
    assert listing(tmp_path) == []
