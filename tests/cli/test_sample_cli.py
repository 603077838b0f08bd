"""``brickwork sample`` with no prompt continues the run's held-out data, draws several samples, and
refuses a prompt its tokenizer cannot encode in one line naming the character; a spec that leaves
out vocab_size takes the data's."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from cli_runs import check_ok, run_cli

from brickwork.cli import SAMPLE_SEPARATOR, main
from brickwork.data import read_corpus
from brickwork.factory import dump_spec, get_preset, load_spec

pytestmark = pytest.mark.slow
TINY = [
    "decoder.num_layers=1",
    "dim_model=32",
    "decoder.block.attention.num_heads=2",
    "train.steps=2",
    "train.batch_size=2",
    "train.seq_len=16",
    "train.eval_batches=1",
    "train.sample_tokens=8",
]


@pytest.fixture(scope="module")
def text() -> str:
    return read_corpus(None)[0].decode()[:20_000]


@pytest.fixture(scope="module")
def char_run(workdir: Path, text: str) -> tuple[Path, str]:
    """A run trained on a nanoGPT character folder from a spec without vocab_size; (run, its stdout)."""
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    folder = workdir / "chars"
    folder.mkdir()
    ids[: len(ids) * 9 // 10].tofile(folder / "train.bin")
    ids[len(ids) * 9 // 10 :].tofile(folder / "val.bin")
    (folder / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": len(chars), "stoi": stoi}))
    spec = get_preset("gpt-tiny")
    del spec["vocab_size"]
    dump_spec(spec, workdir / "mine.yaml")
    out = check_ok(run_cli(["train", "mine.yaml", *TINY, "data.path=chars", "train.out_dir=run"], workdir))
    return workdir / "run", out


def test_a_spec_without_vocab_size_takes_the_tokenizers(char_run: tuple[Path, str], text: str) -> None:
    run, out = char_run
    vocab = len(set(text))
    assert f"vocab_size {vocab}: left out of the spec, so the tokenizer characters of chars/meta.pkl" in out
    assert load_spec(run / "config.yaml")["vocab_size"] == vocab


def test_without_a_prompt_the_sample_continues_the_held_out_data(
    capsys, monkeypatch, char_run, text, tmp_path
) -> None:
    run, _ = char_run
    monkeypatch.chdir(tmp_path)  # where config.yaml's data.path=chars is not
    assert main(["sample", str(run)]) == 2
    assert capsys.readouterr().err.strip() == (
        "brickwork sample: error: --prompt: the default prompt, the run's held-out data, cannot be read "
        "(data.path: file or folder 'chars' does not exist); give a prompt"
    )
    monkeypatch.chdir(run.parent)  # where the run was trained
    before = sorted(run.rglob("*"))
    assert main(["sample", str(run), "--max-new-tokens", "10"]) == 0
    out = capsys.readouterr().out.rstrip("\n")
    held_out = text[len(text) * 9 // 10 :]
    assert out.startswith(held_out[:4]) and len(out) == 14  # a quarter window, then 10 tokens
    assert sorted(run.rglob("*")) == before  # no token cache written into the run


def test_num_samples_draws_each_with_its_own_seed(capsys, char_run) -> None:
    run, _ = char_run
    args = ["sample", str(run), "--prompt", "Tale", "--max-new-tokens", "12", "--num-samples", "3"]
    assert main(args) == 0
    samples = capsys.readouterr().out.rstrip("\n").split(f"\n{SAMPLE_SEPARATOR}\n")
    assert len(samples) == 3 and all(s.startswith("Tale") and len(s) == 16 for s in samples)
    assert len(set(samples)) > 1
    assert main([*args[:-2], "--seed", "1"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == samples[1]  # the second sample is seed 0 + 1


def test_an_unencodable_prompt_names_the_character(capsys, char_run, text) -> None:
    run, _ = char_run
    assert main(["sample", str(run), "--prompt", "Tale ☃ end"]) == 2
    assert capsys.readouterr().err.strip() == (
        "brickwork sample: error: --prompt: '☃' (character 6) is not in the vocabulary of "
        f"{run / 'tokenizer.json'} ({len(set(text))} tokens)"
    )
