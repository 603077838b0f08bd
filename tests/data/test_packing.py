"""data.pack: documents end to end, each ended by its id, cut into full windows with document ids."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from brickwork.blocks import IGNORE_INDEX
from brickwork.data.config import DataConfig
from brickwork.data.packing import BYTE_END_OF_DOCUMENT, document_ids_of, end_of_document
from brickwork.data.sources import check_packable, open_text_data
from brickwork.data.tokenizer import ByteTokenizer, HFTokenizer, TokenIds
from brickwork.errors import ConfigError
from brickwork.train.tasks import TASKS

DOCS = ["Ada went to the mill.", "Bram stayed home all day long.", "Hi.", "Cora took the boat out at dusk."]


def jsonl(tmp_path: Path, docs: list[str] = DOCS) -> Path:
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


def test_jsonl_documents_each_end_with_the_end_of_text_id(tmp_path: Path, bpe: HFTokenizer) -> None:
    config = DataConfig(path=str(jsonl(tmp_path)), pack=True, val_fraction=0.5)
    text = open_text_data(config, bpe, tmp_path / "cache", seq_len=2)
    want = [i for d in DOCS for i in [*bpe.encode(d).tolist(), bpe.end_of_text]]  # the last one too
    assert torch.cat([text.train, text.val]).tolist() == want
    assert text.end_id == bpe.end_of_text
    # Unpacked, the same source is cached apart: the id only separates documents.
    plain = open_text_data(DataConfig(path=config.path, val_fraction=0.5), bpe, tmp_path / "cache", seq_len=2)
    assert torch.cat([plain.train, plain.val]).tolist() == want[:-1] and plain.end_id is None


def test_bytes_end_documents_with_nul_and_batches_restart_positions(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, doc in enumerate(DOCS):
        (folder / f"{i}.txt").write_text(doc)
    config = DataConfig(path=str(folder), pack=True, val_fraction=0.5)
    text = open_text_data(config, ByteTokenizer(), tmp_path / "cache", seq_len=16)
    assert text.end_id == BYTE_END_OF_DOCUMENT == end_of_document(ByteTokenizer())
    stream = torch.cat([text.train, text.val]).long()
    assert bytes(stream.tolist()) == b"".join(d.encode() + b"\0" for d in DOCS)

    source = TASKS["causal_lm"].text_batches(stream, rows=8, seq_len=16, seed=0, base=256, end_id=0)
    batch = source.next_batch()
    ids, docs, labels = batch["input_ids"], batch["document_ids"], batch["labels"]
    assert ids.shape == docs.shape == labels.shape == (8, 16)  # full windows, no padding
    for row, row_docs, row_labels in zip(ids.tolist(), docs.tolist(), labels.tolist()):
        for t in range(16):
            ended_before = row[:t].count(0)  # the NULs before t: a document's own NUL is its last token
            assert row_docs[t] == ended_before
            begins = t == 0 or row[t - 1] == 0
            # Nothing predicts a document's first token from the one before; every other target stays.
            assert row_labels[t] == (IGNORE_INDEX if begins else row[t])


def test_document_ids_of_a_window() -> None:
    window = torch.tensor([[5, 6, 9, 7, 9, 9, 8]])
    assert document_ids_of(window, end_id=9).tolist() == [[0, 0, 0, 1, 1, 2, 3]]


def test_sources_without_document_boundaries_are_refused(tmp_path: Path, bpe: HFTokenizer) -> None:
    text_file = tmp_path / "story.txt"
    text_file.write_text("Once upon a time.\n" * 4)
    bin_file = tmp_path / "train.bin"
    np.arange(64, dtype=np.uint16).tofile(bin_file)
    refused = [
        (DataConfig(pack=True), ByteTokenizer(), "the embedded corpus is one stream"),
        (DataConfig(path=str(text_file), pack=True), ByteTokenizer(), "data.path is a text file"),
        (DataConfig(path=str(bin_file), pack=True), TokenIds(64), "has no end-of-text id"),
        (DataConfig(path=str(jsonl(tmp_path)), pack=True), TokenIds(64), "has no <|endoftext|> token"),
    ]
    for config, tokenizer, message in refused:
        with pytest.raises(ConfigError, match=rf"^data.pack: .*{message}"):
            check_packable(config, tokenizer)
    # .bin ids whose tokenizer has an end-of-text id are split at it.
    assert check_packable(DataConfig(path=str(bin_file), pack=True), bpe) == bpe.end_of_text
    with pytest.raises(ConfigError, match=r"^pack: must be true or false"):
        DataConfig(pack="yes")


def test_a_document_holding_the_end_id_is_refused_before_the_cache_is_kept(tmp_path: Path) -> None:
    path = jsonl(tmp_path, ["fine", "a NUL \u0000 inside"])
    cache = tmp_path / "cache"
    with pytest.raises(ConfigError, match=r"^data.pack: docs.jsonl holds the end-of-document id 0"):
        open_text_data(DataConfig(path=str(path), pack=True), ByteTokenizer(), cache, seq_len=2)
    assert not any(cache.glob("tokens-*"))
