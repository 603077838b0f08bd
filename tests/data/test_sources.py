"""Data sources: text files, folders, jsonl and nanoGPT .bin folders, read as memory-mapped token files."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from brickwork.data import sources
from brickwork.data.config import DataConfig
from brickwork.data.sources import declared_tokenizer, detect_format, open_text_data
from brickwork.data.tokenizer import ByteTokenizer, HFTokenizer, TokenIds
from brickwork.errors import ConfigError

TEXT = "The fox went to the mill.\nThe hare stayed home.\n" * 40


def data_config(path: Path | None, **options) -> DataConfig:
    return DataConfig(path=None if path is None else str(path), **options)


def nanogpt_folder(root: Path, train: list[int], val: list[int], meta: dict | None = None) -> Path:
    root.mkdir()
    np.array(train, dtype=np.uint16).tofile(root / "train.bin")
    np.array(val, dtype=np.uint16).tofile(root / "val.bin")
    if meta is not None:
        (root / "meta.pkl").write_bytes(pickle.dumps(meta))
    return root


def test_formats_are_detected_or_checked(tmp_path):
    (tmp_path / "a.txt").write_text(TEXT)
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    (tmp_path / "a.bin").write_bytes(b"\0\0")
    (tmp_path / "a.parquet").write_bytes(b"PAR1")
    folder = nanogpt_folder(tmp_path / "gpt", [1, 2], [3])
    (tmp_path / "texts").mkdir()
    assert detect_format(tmp_path / "a.txt", "auto", "data.path") == "text"
    assert detect_format(tmp_path / "a.jsonl", "auto", "data.path") == "jsonl"
    assert detect_format(tmp_path / "a.bin", "auto", "data.path") == "bin"
    assert detect_format(folder, "auto", "data.path") == "bin"
    assert detect_format(tmp_path / "texts", "auto", "data.path") == "folder"
    assert detect_format(tmp_path / "a.jsonl", "text", "data.path") == "text"  # a set format wins
    with pytest.raises(ConfigError, match=r"data.path: unknown format of .*a.parquet.*allowed: auto, bin"):
        detect_format(tmp_path / "a.parquet", "auto", "data.path")
    with pytest.raises(ConfigError, match=r"data.format: unknown format 'csv'; allowed: .*jsonl"):
        detect_format(tmp_path / "a.txt", "csv", "data.path")
    with pytest.raises(ConfigError, match=r"data.path: folder .*texts' has no train.bin"):
        detect_format(tmp_path / "texts", "bin", "data.path")
    with pytest.raises(ConfigError, match=r"data.val_path: .*a.txt' is a file, not a folder"):
        detect_format(tmp_path / "a.txt", "folder", "data.val_path")
    with pytest.raises(ConfigError, match=r"data.path: file or folder .*nope' does not exist"):
        detect_format(tmp_path / "nope", "auto", "data.path")


def test_a_text_file_in_bytes_is_the_file_itself_mapped(tmp_path):
    (tmp_path / "a.txt").write_text(TEXT)
    text = open_text_data(data_config(tmp_path / "a.txt"), ByteTokenizer(), tmp_path / "cache", seq_len=16)
    whole = torch.cat([text.train, text.val]).long()
    assert whole.tolist() == list(TEXT.encode())
    assert text.train.dtype == torch.uint8
    assert text.val.numel() == round(len(TEXT) * 0.1)
    assert not (tmp_path / "cache").exists()  # nothing to tokenise: no copy


def test_a_folder_is_tokenised_once_into_the_cache(tmp_path, monkeypatch):
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text("second document " * 20)
    (folder / "sub" / "a.md").write_text("first document " * 20)
    (folder / ".hidden").write_text("never read")
    cfg = data_config(folder, val_fraction=0.2)
    text = open_text_data(cfg, ByteTokenizer(), tmp_path / "cache", seq_len=8)
    expected = ("second document " * 20 + "\n\n" + "first document " * 20).encode()
    # Sorted paths: b.txt before sub/a.md; documents separated by a blank line.
    assert torch.cat([text.train, text.val]).tolist() == list(expected)
    cached = list((tmp_path / "cache").iterdir())
    assert len(cached) == 1 and cached[0].name.startswith("tokens-")

    def refuse(*args, **kwargs):
        raise AssertionError("tokenised again")

    monkeypatch.setattr(sources, "write_token_file", refuse)
    again = open_text_data(cfg, ByteTokenizer(), tmp_path / "cache", seq_len=8)
    assert torch.equal(again.train, text.train)


def test_jsonl_documents_are_separated_by_the_end_of_text_id(tmp_path, bpe: HFTokenizer):
    lines = [{"text": "Ada went to the mill.", "id": 1}, {"text": "Bram stayed home.", "id": 2}]
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n\n")
    text = open_text_data(data_config(path, val_fraction=0.5), bpe, tmp_path / "cache", seq_len=2)
    first, second = (bpe.encode(line["text"]).tolist() for line in lines)
    expected = [*first, bpe.end_of_text, *second]
    assert torch.cat([text.train, text.val]).tolist() == expected
    other = tmp_path / "other.jsonl"
    other.write_text('{"body": "Ada went to the mill, and Bram went home."}\n')
    text = open_text_data(data_config(other, text_key="body", val_fraction=0.5), bpe, tmp_path / "cache", 1)
    whole = bpe.encode("Ada went to the mill, and Bram went home.").tolist()
    assert torch.cat([text.train, text.val]).tolist() == whole


def test_bad_jsonl_lines_name_the_line_the_file_and_the_key(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "fine"}\n{"body": "no text key"}\n')
    with pytest.raises(
        ConfigError, match=r"data.text_key: line 2 of .*docs.jsonl' has no 'text' key \(it has: body\)"
    ):
        open_text_data(data_config(path), ByteTokenizer(), tmp_path / "cache", seq_len=2)
    assert list((tmp_path / "cache").iterdir()) == []  # the partial token file is gone
    path.write_text('{"text": "fine"}\nnot json\n')
    with pytest.raises(ConfigError, match=r"data.path: line 2 of .*docs.jsonl' is not JSON"):
        open_text_data(data_config(path), ByteTokenizer(), tmp_path / "cache", seq_len=2)


def test_nanogpt_folder_with_character_meta(tmp_path):
    chars = sorted(set(TEXT))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = [stoi[c] for c in TEXT]
    folder = nanogpt_folder(
        tmp_path / "shakespeare_char", ids[:1500], ids[1500:], {"vocab_size": len(chars), "stoi": stoi,
        "itos": dict(enumerate(chars))}
    )  # fmt: skip
    tokenizer = declared_tokenizer(str(folder), None, spec_vocab=50257)
    assert tokenizer.vocab_size == len(chars)
    assert tokenizer.encode("The fox").tolist() == [stoi[c] for c in "The fox"]
    text = open_text_data(data_config(folder), tokenizer, tmp_path / "cache", seq_len=16)
    assert text.train.tolist() == ids[:1500] and text.val.tolist() == ids[1500:]
    assert text.train.dtype == torch.uint16
    assert tokenizer.decode(text.val[:20]) == TEXT[1500:1520]
    assert not (tmp_path / "cache").exists()


def test_nanogpt_folder_without_a_tokenizer_takes_the_spec_vocab(tmp_path):
    folder = nanogpt_folder(tmp_path / "owt", list(range(100, 400)), list(range(50)))
    tokenizer = declared_tokenizer(str(folder), None, spec_vocab=50257)
    assert isinstance(tokenizer, TokenIds) and tokenizer.vocab_size == 50257
    with pytest.raises(ConfigError, match=r"data.tokenizer: .*declares no tokenizer.*set vocab_size"):
        declared_tokenizer(str(folder), None, spec_vocab=None)
    nanogpt_folder(tmp_path / "counted", [1, 2], [3], {"vocab_size": 50304})
    assert declared_tokenizer(str(tmp_path / "counted"), None, 64).vocab_size == 50304


def test_token_files_with_ids_past_the_vocabulary_or_cut_short_are_refused(tmp_path):
    folder = nanogpt_folder(tmp_path / "a", [1, 2, 3, 70, 4] * 10, [1] * 20, {"vocab_size": 65})
    tokenizer = declared_tokenizer(str(folder), None, None)
    with pytest.raises(
        ConfigError,
        match=r"data.path: token file .*train.bin' holds id 70 at position 3, but vocab_size is 65",
    ):
        open_text_data(data_config(folder), tokenizer, tmp_path / "cache", seq_len=4)
    with (folder / "train.bin").open("ab") as handle:
        handle.write(b"\x01")
    with pytest.raises(ConfigError, match=r"train.bin' has 101 bytes, not a whole number of uint16 ids"):
        open_text_data(data_config(folder), tokenizer, tmp_path / "cache", seq_len=4)


def test_val_path_is_held_out_whole(tmp_path):
    (tmp_path / "train.txt").write_text(TEXT)
    (tmp_path / "val.txt").write_text("held out text, all of it")
    cfg = data_config(tmp_path / "train.txt", val_path=str(tmp_path / "val.txt"))
    text = open_text_data(cfg, ByteTokenizer(), tmp_path / "cache", seq_len=8)
    assert text.train.numel() == len(TEXT)
    assert bytes(text.val.tolist()) == b"held out text, all of it"
    with pytest.raises(
        ConfigError, match=r"data.val_path: '.*/val.txt' holds 24 bytes, fewer than train.seq_len \+ 1 = 33"
    ):
        open_text_data(cfg, ByteTokenizer(), tmp_path / "cache", seq_len=32)


def test_a_token_file_too_short_for_a_window_is_named(tmp_path):
    folder = nanogpt_folder(tmp_path / "gpt", list(range(100)), list(range(10)), {"vocab_size": 100})
    with pytest.raises(
        ConfigError, match=r"data.path: '.*/gpt/val.bin' holds 10 tokens, fewer than train.seq_len \+ 1 = 33"
    ):
        open_text_data(data_config(folder), TokenIds(100), tmp_path / "cache", seq_len=32)
    np.array(range(20), dtype=np.uint16).tofile(folder / "train.bin")
    np.array(range(40), dtype=np.uint16).tofile(folder / "val.bin")
    with pytest.raises(ConfigError, match=r"data.path: '.*/gpt/train.bin' holds 20 tokens, fewer than"):
        open_text_data(data_config(folder), TokenIds(100), tmp_path / "cache", seq_len=32)
    # Split into training and held-out parts, the text is named by its source, not a cache file.
    (tmp_path / "short.jsonl").write_text('{"text": "only a few words"}\n')
    with pytest.raises(ConfigError, match=r"data.path: '.*/short.jsonl' has 16 bytes, too short for"):
        open_text_data(data_config(tmp_path / "short.jsonl"), ByteTokenizer(), tmp_path / "cache", seq_len=32)


def test_empty_folders_and_files_are_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "blank.txt").write_text("")
    with pytest.raises(ConfigError, match=r"data.path: folder .*empty' holds no text files"):
        open_text_data(data_config(tmp_path / "empty"), ByteTokenizer(), tmp_path / "cache", seq_len=4)
    with pytest.raises(ConfigError, match=r"data.path: file .*blank.txt' is empty"):
        open_text_data(data_config(tmp_path / "empty" / "blank.txt"), ByteTokenizer(), tmp_path / "c", 4)


def test_a_real_tokenizer_needs_utf8_and_says_which_byte(tmp_path, bpe: HFTokenizer):
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 ".encode("latin-1") * 10)
    with pytest.raises(ConfigError, match=r"latin1.txt' is not UTF-8 text \(byte 3\)"):
        open_text_data(data_config(tmp_path / "latin1.txt"), bpe, tmp_path / "cache", seq_len=2)


def test_a_large_text_file_streams_in_pieces_cut_at_line_ends(tmp_path, bpe: HFTokenizer, monkeypatch):
    monkeypatch.setattr(sources, "PIECE_BYTES", 100)  # many pieces, most ending inside a line
    text = "".join(f"Line {i}: Ada carried {i} loaves of bread to Bram, naïvely.\n" for i in range(30))
    (tmp_path / "big.txt").write_text(text + "and a last line with no end")
    data = open_text_data(data_config(tmp_path / "big.txt"), bpe, tmp_path / "cache", seq_len=4)
    lines = (text + "and a last line with no end").splitlines(keepends=True)
    assert torch.cat([data.train, data.val]).tolist() == [
        i for line in lines for i in bpe.encode(line).tolist()
    ]
    (tmp_path / "one_line.txt").write_text("word " * 100)
    data = open_text_data(data_config(tmp_path / "one_line.txt"), bpe, tmp_path / "cache", seq_len=4)
    assert bpe.decode(torch.cat([data.train, data.val])) == "word " * 100
