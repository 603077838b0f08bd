"""``brickwork train`` with ``data.pack``: a jsonl source trains packed; what cannot pack stops the run
in one line before anything is written, and ``brickwork eval`` makes the same checks."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from cli_runs import read_metrics

from brickwork.cli import main
from brickwork.data.tokenizer import ByteTokenizer
from brickwork.errors import ConfigError
from brickwork.factory import build_model, save_pretrained
from brickwork.parallel import ParallelConfig
from brickwork.train.packing import check_packing
from brickwork.train.run_config import resolve_run, task_spec
from brickwork.train.tasks import TASKS

TINY = [
    "decoder.num_layers=1",
    "dim_model=32",
    "decoder.block.attention.num_heads=2",
    "train.steps=2",
    "train.batch_size=2",
    "train.seq_len=32",
    "train.eval_interval=2",
    "train.eval_batches=1",
    "train.checkpoint_interval=2",
    "train.sample_tokens=8",
]


def documents(path: Path) -> Path:
    rng = random.Random(0)
    words = ["the", "fox", "went", "to", "the", "mill", "and", "the", "hare", "stayed", "home"]
    lines = [json.dumps({"text": " ".join(rng.choices(words, k=rng.randint(3, 20)))}) for _ in range(200)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_packed_jsonl_run_trains_and_evaluates(capsys, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    documents(tmp_path / "docs.jsonl")
    assert main(["train", *TINY, "data.path=docs.jsonl", "data.pack=true", "train.out_dir=run"]) == 0
    assert "documents packed, each ended by id 0" in capsys.readouterr().out
    losses = [m["val_loss"] for m in read_metrics(tmp_path / "run") if m.get("val_loss") is not None]
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)


def test_what_cannot_pack_stops_before_the_run_folder(capsys, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    documents(tmp_path / "docs.jsonl")
    refused = {
        "favor": (["data.path=docs.jsonl", "decoder.block.attention.mechanism.name=favor"],
                  "data.pack: attention 'favor' at layers.0.attention cannot keep packed documents apart"),
        "corpus": ([], "data.pack: the embedded corpus is one stream with no document boundaries"),
    }  # fmt: skip
    for name, (overrides, message) in refused.items():
        assert main(["train", *TINY, *overrides, "data.pack=true", f"train.out_dir=runs/{name}"]) == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "runs").exists()
    # A pipeline or context parallel packs (reached under torchrun); the two together are refused.
    run = resolve_run(None, [*TINY, "data.path=docs.jsonl", "data.pack=true"])
    spec = task_spec(run, TASKS["causal_lm"], ByteTokenizer(), quiet=True)
    for layout in ({"pipeline_parallel_size": 2}, {"context_parallel_size": 2}):
        check_packing(run, TASKS["causal_lm"], ByteTokenizer(), spec, ParallelConfig(**layout))
    both = ParallelConfig(context_parallel_size=2, pipeline_parallel_size=2)
    with pytest.raises(ConfigError, match=r"^data.pack: context_parallel_size=2 gathers the document ids"):
        check_packing(run, TASKS["causal_lm"], ByteTokenizer(), spec, both)
    with pytest.raises(ConfigError, match=r"^data.pack: packs documents for causal_lm; this run's task"):
        check_packing(run, TASKS["masked_lm"], ByteTokenizer(), spec, ParallelConfig())


def test_eval_refuses_packing_for_a_mechanism_without_full_masks(capsys, tmp_path: Path, monkeypatch) -> None:
    # The start-time check, made before any data is read or any batch evaluated.
    monkeypatch.chdir(tmp_path)
    documents(tmp_path / "docs.jsonl")
    run = resolve_run(None, [*TINY, "decoder.block.attention.mechanism.name=favor"])
    save_pretrained(build_model(task_spec(run, TASKS["causal_lm"], ByteTokenizer(), quiet=True)), "saved")

    def unreachable(*args: object) -> None:
        raise AssertionError("reached after the check")

    monkeypatch.setattr("brickwork.train.evaluation.open_text_data", unreachable)
    assert main(["eval", "saved", "data.path=docs.jsonl", "data.pack=true"]) == 2
    message = "data.pack: attention 'favor' at layers.0.attention cannot keep packed documents apart"
    assert message in capsys.readouterr().err
