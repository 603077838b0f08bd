"""A resumed run goes on with the data it started with: data.json records each data file and the
tokenizer, and ``--resume`` refuses a change, naming it, unless ``--accept-data-change`` accepts it
(a tokenizer of another size never)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from cli_runs import read_metrics

from brickwork.cli import main
from brickwork.data import read_corpus
from brickwork.data.tokenizer import HFTokenizer

TINY = [
    "decoder.num_layers=1",
    "dim_model=32",
    "decoder.block.attention.num_heads=2",
    "train.steps=2",
    "train.batch_size=2",
    "train.seq_len=16",
    "train.eval_interval=2",
    "train.eval_batches=1",
    "train.checkpoint_interval=2",
    "train.sample_tokens=0",
]


@pytest.fixture(scope="module")
def corpus() -> str:
    return read_corpus(None)[0].decode()[:12_000]


def train(capsys: pytest.CaptureFixture, *args: str) -> str:
    assert main(["train", *args]) == 0
    return capsys.readouterr().out


def refused(capsys: pytest.CaptureFixture, *args: str) -> str:
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def snapshot(run: Path) -> dict[str, bytes]:
    """Every file of the run folder but its lock, with its bytes."""
    return {
        str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"
    }


def write_meta(folder: Path, chars: str) -> None:
    """A nanoGPT meta.pkl declaring the characters ``chars``, with ids in that order."""
    stoi = {c: i for i, c in enumerate(chars)}
    (folder / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": len(chars), "stoi": stoi}))


def write_chars(folder: Path, text: str, chars: str) -> None:
    """A nanoGPT character folder (train.bin, val.bin, meta.pkl) of ``text`` over the vocabulary ``chars``."""
    ids = np.array([chars.index(c) for c in text], dtype=np.uint16)
    folder.mkdir()
    ids[: len(ids) * 9 // 10].tofile(folder / "train.bin")
    ids[len(ids) * 9 // 10 :].tofile(folder / "val.bin")
    write_meta(folder, chars)


def test_a_replaced_data_file_is_refused_by_name_and_trained_on_once_accepted(
    capsys, tmp_path, monkeypatch, corpus
):
    monkeypatch.chdir(tmp_path)
    Path("tales.txt").write_text(corpus[:4000])
    train(capsys, *TINY, "data.path=tales.txt", "train.out_dir=run")
    run = tmp_path / "run"
    record = json.loads((run / "data.json").read_text())
    assert [(f["option"], f["file"], f["size"]) for f in record["files"]] == [
        ("data.path", "tales.txt", 4000)
    ]
    assert record["tokenizer"]["name"] == "bytes" and record["tokenizer"]["vocab_size"] == 256
    assert record["accepted"] == []

    # The same data: the run goes on as before, its record untouched.
    kept = (run / "data.json").read_bytes()
    out = train(capsys, "--resume", "run", "train.steps=3")
    assert "resuming run from step 2 of 3" in out and "data.json" not in out
    assert (run / "data.json").read_bytes() == kept

    # Other text of the same size, then a longer file: refused, naming the file, with nothing written.
    before = snapshot(run)
    Path("tales.txt").write_text(corpus[4000:8000])
    err = refused(capsys, "--resume", "run", "train.steps=4")
    assert err == (
        "brickwork train: error: data.path: the data changed since the run started (run/data.json): "
        "'tales.txt' has other content (the same 4,000 bytes); put back what the run trained on, or "
        "resume with --accept-data-change to train on it from step 3"
    )
    Path("tales.txt").write_text(corpus[4000:9000])
    assert "'tales.txt' has 5,000 bytes, not the 4,000 it had" in refused(
        capsys, "--resume", "run", "train.steps=4"
    )
    assert snapshot(run) == before

    out = train(capsys, "--resume", "run", "train.steps=4", "--accept-data-change")
    change = "'tales.txt' has 5,000 bytes, not the 4,000 it had"
    assert (
        f"--accept-data-change: from step 3 the run trains on changed data ({change}); data.json records it"
        in out
    )
    assert [r["step"] for r in read_metrics(run) if "loss" in r] == [1, 2, 3, 4]
    record = json.loads((run / "data.json").read_text())
    assert record["files"][0]["size"] == 5000
    assert record["accepted"] == [{"step": 3, "changes": [change]}]
    assert "resuming run from step 4 of 5" in train(capsys, "--resume", "run", "train.steps=5")

    # A run folder from before data.json resumes unchecked, saying so once, and is recorded from then on.
    (run / "data.json").unlink()
    out = train(capsys, "--resume", "run", "train.steps=6")
    assert out.count("run has no data.json (the run started before runs recorded their data)") == 1
    assert json.loads((run / "data.json").read_text())["files"][0]["size"] == 5000


def test_a_tokenizer_of_another_size_is_refused_even_when_accepted(capsys, tmp_path, monkeypatch, corpus):
    monkeypatch.chdir(tmp_path)
    chars = "".join(sorted(set(corpus)))
    write_chars(tmp_path / "chars", corpus, chars)
    train(capsys, *TINY, "data.path=chars", "train.out_dir=run")
    run = tmp_path / "run"
    assert json.loads((run / "data.json").read_text())["tokenizer"]["vocab_size"] == len(chars)
    before = snapshot(run)

    write_meta(tmp_path / "chars", chars + "~")  # one character more
    for accept in ([], ["--accept-data-change"]):
        err = refused(capsys, "--resume", "run", "train.steps=3", *accept)
        assert err.startswith(
            f"brickwork train: error: data.tokenizer: characters of chars/meta.pkl ({len(chars) + 1} tokens) "
            f"has {len(chars) + 1} ids, but the run started with characters of chars/meta.pkl "
            f"({len(chars)} tokens), of {len(chars)}"
        )
        assert "not even with --accept-data-change" in err
    assert snapshot(run) == before

    # As many characters in another order: another tokenizer of the same size, which the option accepts.
    write_meta(tmp_path / "chars", chars[1] + chars[0] + chars[2:])
    err = refused(capsys, "--resume", "run", "train.steps=3")
    assert "data.tokenizer: the data changed since the run started" in err
    assert "the tokenizer characters of chars/meta.pkl" in err and "its contents differ" in err
    assert snapshot(run) == before
    out = train(capsys, "--resume", "run", "train.steps=3", "--accept-data-change")
    assert "--accept-data-change: from step 2 the run trains on changed data (the tokenizer" in out
    # brickwork sample decodes with the tokenizer the run now trains with.
    kept = HFTokenizer.from_file(run / "tokenizer.json")
    assert kept.encode(chars[0] + chars[1]).tolist() == [1, 0]

    # A run folder from before data.json has no record of its tokenizer; the model's vocabulary still
    # refuses one with more ids than it has rows, before anything is written.
    (run / "data.json").unlink()
    write_meta(tmp_path / "chars", chars + "~")
    before = snapshot(run)
    err = refused(capsys, "--resume", "run", "train.steps=4")
    assert err.startswith(
        f"brickwork train: error: vocab_size: {len(chars)} is smaller than the {len(chars) + 1} ids"
    )
    assert snapshot(run) == before


def test_accept_data_change_needs_resume(capsys) -> None:
    err = refused(capsys, "--accept-data-change", "train.steps=1")
    assert err.endswith(
        "--accept-data-change: a new run has no earlier data to differ from; use it with --resume"
    )
