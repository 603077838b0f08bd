"""``brickwork train`` on the user's own data and tokenizer, ``brickwork tokenizer train`` and
``brickwork sample``; bad data stops the run with one line and leaves no run folder."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_runs import check_ok, read_metrics, run_cli
from safetensors.torch import save_file

from brickwork.cli import main
from brickwork.data import read_corpus
from brickwork.factory import load_spec

TINY = [
    "decoder.num_layers=1",
    "dim_model=32",
    "decoder.block.attention.num_heads=2",
    "train.steps=2",
    "train.batch_size=2",
    "train.seq_len=16",
    "train.eval_interval=1",
    "train.eval_batches=1",
    "train.checkpoint_interval=1",
    "train.sample_tokens=40",
]


def char_folder(root: Path, text: str, vocab_size: int | None = None) -> Path:
    """A nanoGPT shakespeare_char-style folder: uint16 train.bin / val.bin and meta.pkl."""
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    root.mkdir()
    cut = len(ids) * 9 // 10
    ids[:cut].tofile(root / "train.bin")
    ids[cut:].tofile(root / "val.bin")
    meta = {"vocab_size": vocab_size or len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}
    (root / "meta.pkl").write_bytes(pickle.dumps(meta))
    return root


@pytest.fixture(scope="module")
def corpus_text() -> str:
    return read_corpus(None)[0].decode()[:20_000]


def error_line(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def bad_inputs(root: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (overrides, the error it must give); each names the file or key at fault."""
    (root / "data.csv.gz").write_bytes(b"\x1f\x8b")
    big = char_folder(root / "ids", "abcdefgh" * 50)
    ids = np.fromfile(big / "train.bin", dtype=np.uint16)
    ids[100] = 8  # one past the 8 characters
    ids.tofile(big / "train.bin")
    cut = char_folder(root / "cut", "abcdefgh" * 50)
    with (cut / "val.bin").open("ab") as handle:
        handle.write(b"\x00")
    short = char_folder(root / "short", "abcdefgh" * 50)
    np.zeros(10, dtype=np.uint16).tofile(short / "val.bin")
    (root / "docs.jsonl").write_text('{"text": "a line of text, long enough"}\n{"title": "no text"}\n')
    (root / "empty").mkdir()
    char_folder(root / "good", "abcdefgh" * 50)
    return {
        "unknown format": (["data.path=data.csv.gz"], r"data.path: unknown format of 'data.csv.gz' \(.gz is"),
        "format typo": (["data.path=docs.jsonl", "data.format=jsnol"], r"data.format: unknown value 'jsnol'"),
        "id past the vocabulary": (
            ["data.path=ids"],
            r"data.path: token file 'ids/train.bin' holds id 8 at position 100, but vocab_size is 8",
        ),
        "truncated bin": (
            ["data.path=cut"],
            r"data.path: token file 'cut/val.bin' has 81 bytes, not a whole",
        ),
        "val.bin too short": (
            ["data.path=short"],
            r"data.path: 'short/val.bin' holds 10 tokens, fewer than train.seq_len \+ 1 = 17",
        ),
        "jsonl without the key": (
            ["data.path=docs.jsonl"],
            r"data.text_key: line 2 of 'docs.jsonl' has no 'text' key \(it has: title\)",
        ),
        "empty folder": (["data.path=empty"], r"data.path: folder 'empty' holds no text files"),
        "prompt the tokenizer cannot encode": (
            ["data.path=good", "train.sample_prompt=xyz"],
            r"train.sample_prompt: the tokenizer characters of good/meta.pkl \(8 tokens\) cannot encode",
        ),
        "vocab below the tokenizer's": (
            ["data.path=good", "vocab_size=4"],
            r"vocab_size: 4 is smaller than the 8 ids of the data: the tokenizer characters of",
        ),
    }


def test_bad_data_stops_with_one_line_and_leaves_no_run_folder(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name, (overrides, expected) in bad_inputs(tmp_path).items():
        out_dir = tmp_path / "runs" / name.replace(" ", "_")
        err = error_line(capsys, ["train", *TINY, *overrides, f"train.out_dir={out_dir}"])
        assert re.search(expected, err), (name, err)
        assert not out_dir.exists(), name
        assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


@pytest.mark.slow
def test_nanogpt_char_folder_trains_samples_and_resumes_for_more_steps(tmp_path, corpus_text):
    char_folder(tmp_path / "chars", corpus_text)
    vocab = len(set(corpus_text))
    out = check_ok(run_cli(["train", *TINY, "data.path=chars", "train.out_dir=run"], tmp_path))
    assert f"vocab_size 256 -> {vocab}: the vocabulary of characters of chars/meta.pkl" in out
    assert "data: chars (" in out and "uint16 tokens" in out and "with its val.bin held out" in out
    run = tmp_path / "run"
    assert load_spec(run / "config.yaml")["vocab_size"] == vocab
    assert (run / "tokenizer.json").is_file()
    # The end-of-run sample starts with the held-out text, 40 tokens past a 16-token window.
    val_start = corpus_text[len(corpus_text) * 9 // 10 :][:4]
    sample = out.split("temperature 0.8):\n", 1)[1]
    assert sample.startswith(val_start) and len(sample.rstrip("\n")) == 44

    args = ["sample", "run", "--prompt", "Tale 3: ", "--max-new-tokens", "50", "--seed", "7", "--top-k", "5"]
    first = check_ok(run_cli(args, tmp_path))
    assert first.startswith("Tale 3: ") and len(first.rstrip("\n")) == 58
    assert set(first.rstrip("\n")) <= set(corpus_text)
    assert check_ok(run_cli(args, tmp_path)) == first  # a seed fixes the text
    assert check_ok(run_cli([*args[:-3], "8", "--top-k", "5"], tmp_path)) != first

    # The exported file samples the same text, given the run's tokenizer and window.
    check_ok(run_cli(["export", "run", "model.safetensors"], tmp_path))
    exported = ["--tokenizer", "run/tokenizer.json", "--window", "16"]
    assert check_ok(run_cli(["sample", "model.safetensors", *args[2:], *exported], tmp_path)) == first

    more = check_ok(run_cli(["train", "--resume", "run", "train.steps=3"], tmp_path))
    assert "resuming run from step 2 of 3" in more
    assert "train.steps changed since step_000002 was saved: 2 -> 3" in more
    assert [r["step"] for r in read_metrics(run) if "loss" in r] == [1, 2, 3]
    assert load_spec(run / "config.yaml")["train"]["steps"] == 3
    err = run_cli(["train", "--resume", "run", "train.steps=1"], tmp_path).stderr
    assert "train.steps: 1 is below step 3 of the newest checkpoint" in err


@pytest.mark.slow
def test_own_bpe_on_jsonl_with_tensorboard(tmp_path, corpus_text):
    (tmp_path / "corpus.txt").write_text(corpus_text)
    made = check_ok(
        run_cli(["tokenizer", "train", "corpus.txt", "--vocab-size", "300", "-o", "tok.json"], tmp_path)
    )
    assert "wrote tok.json: a byte-level BPE of 300 tokens" in made
    tales = corpus_text.split("\n\n")
    (tmp_path / "tales.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in tales))
    args = ["train", *TINY, "data.path=tales.jsonl", "data.tokenizer=tok.json", "train.log_to=tensorboard"]
    out = check_ok(run_cli([*args, "train.out_dir=run"], tmp_path))
    assert "vocab_size 256 -> 300: the vocabulary of tok.json (300 tokens)" in out
    run = tmp_path / "run"
    assert [p.name.startswith("tokens-") for p in (run / "cache").iterdir()] == [True]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    losses = [e.value for e in events.Scalars("loss")]
    assert losses == pytest.approx([r["loss"] for r in read_metrics(run) if "loss" in r])
    assert [e.step for e in events.Scalars("val_loss")] == [0, 1, 2]


# Runs brickwork and writes the process's own peak RSS (VmHWM: this process image only; getrusage's
# ru_maxrss of a child also counts its parent's peak, which a vfork-and-exec child inherits).
PEAK_RSS = (
    "import atexit, sys\n"
    "from pathlib import Path\n"
    "from brickwork.cli import main\n"
    "status = Path('/proc/self/status')\n"
    "peak = lambda: next(l.split()[1] for l in status.read_text().splitlines() if l.startswith('VmHWM'))\n"
    "atexit.register(lambda: Path('peak_kib.txt').write_text(peak()))\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from Linux's /proc")
def test_memory_does_not_grow_with_the_token_file(tmp_path):
    """Peak RSS of a 2-step run on 4M and on 100M uint16 tokens (8 and 200 MB): within 80 MB, which is
    less than the 192 MB more file, let alone the 1.5 GB more of int64 a loaded copy would take. (Two
    runs of the same command differ by up to 30 MB here.)"""
    peaks = {}
    for count in (1 << 22, 100_000_000):
        folder = tmp_path / f"tokens{count}"
        folder.mkdir()
        ids = np.random.default_rng(0).integers(0, 50257, count, dtype=np.uint16)
        ids.tofile(folder / "train.bin")
        ids[: 1 << 16].tofile(folder / "val.bin")
        del ids
        args = ["train", *TINY, "vocab_size=50304", f"data.path={folder}", f"train.out_dir=run{count}"]
        result = subprocess.run(
            [sys.executable, "-c", PEAK_RSS, *args],
            cwd=tmp_path,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        peaks[count] = int((tmp_path / "peak_kib.txt").read_text()) / 1024
    assert peaks[100_000_000] - peaks[1 << 22] < 80, peaks


def test_sample_refuses_what_it_cannot_load(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = error_line(capsys, ["sample", "nope", "--prompt", "x"])
    assert "RUN_OR_FOLDER: 'nope' does not exist" in err
    err = error_line(capsys, ["sample", "nope", "--prompt", "x", "--top-k", "0"])
    assert "--top-k: must be an integer >= 1, got 0" in err
    # A safetensors file brickwork export did not write, and one that is damaged: one line each.
    save_file({"w": torch.zeros(2)}, tmp_path / "foreign.safetensors")
    err = error_line(capsys, ["sample", "foreign.safetensors", "--prompt", "x"])
    assert "RUN_OR_FOLDER: 'foreign.safetensors' carries no brickwork spec in its metadata" in err
    (tmp_path / "damaged.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    err = error_line(capsys, ["sample", "damaged.safetensors", "--prompt", "x"])
    assert "RUN_OR_FOLDER: 'damaged.safetensors' is not a readable safetensors file" in err
    err = error_line(capsys, ["sample", ".", "--prompt", "x"])
    assert "RUN_OR_FOLDER: '.' is none of the folders from_pretrained reads" in err
    err = error_line(capsys, ["tokenizer", "train", "nope.txt", "--vocab-size", "300"])
    assert "FILES: 'nope.txt' is not a file" in err


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(400)
def test_under_torchrun_rank0_tokenises_and_every_rank_sees_bad_data(tmp_path, corpus_text):
    (tmp_path / "docs").mkdir()
    for i, tale in enumerate(corpus_text.split("\n\n")[:40]):
        (tmp_path / "docs" / f"{i:03d}.txt").write_text(tale)
    args = ["train", *TINY, "data.path=docs", "dist.data_parallel_size=2"]
    out = check_ok(run_cli([*args, "train.out_dir=run"], tmp_path, nproc=2))
    assert out.count("data: docs (40 files") == 1
    assert len(list((tmp_path / "run" / "cache").iterdir())) == 1
    (tmp_path / "bad.jsonl").write_text('{"text": "a line"}\n{"title": "none"}\n')
    bad = [*args[:-2], "data.path=bad.jsonl", "dist.data_parallel_size=2", "train.out_dir=bad"]
    result = run_cli(bad, tmp_path, nproc=2, timeout=300)
    assert result.returncode != 0
    assert "data.text_key: line 2 of 'bad.jsonl' has no 'text' key" in result.stderr
    assert not (tmp_path / "bad").exists()
