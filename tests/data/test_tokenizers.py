"""Tokenizers: a byte-level BPE trained offline, loaded by HF transformers too; nanoGPT characters."""

from __future__ import annotations

import pytest
from transformers import PreTrainedTokenizerFast

from brickwork.data.bpe_training import train_bpe
from brickwork.data.tokenizer import (
    END_OF_TEXT,
    ByteTokenizer,
    HFTokenizer,
    TokenIds,
    char_tokenizer,
    load_tokenizer,
)
from brickwork.errors import ConfigError

SAMPLE = 'Tale 7: Ada carried a lantern to the mill.\n\n"Where is it?" asked Bram. Naïve café 日本'


def test_trained_bpe_has_the_size_asked_and_round_trips_any_text(bpe: HFTokenizer):
    assert bpe.vocab_size == 400
    assert bpe.end_of_text == 0 and bpe.tokenizer.id_to_token(0) == END_OF_TEXT
    ids = bpe.encode(SAMPLE)
    assert bpe.decode(ids) == SAMPLE  # byte-level: characters it never saw still encode
    assert len(ids) < len(SAMPLE.encode()) * 0.6  # merges learnt from the corpus shorten its words


def test_hf_transformers_loads_the_same_tokenizer(bpe_file, bpe: HFTokenizer):
    fast = PreTrainedTokenizerFast(tokenizer_file=str(bpe_file))
    assert fast.encode(SAMPLE, add_special_tokens=False) == bpe.encode(SAMPLE).tolist()
    assert len(fast) == bpe.vocab_size


def test_training_refuses_bad_arguments(tmp_path):
    (tmp_path / "a.txt").write_text("some text")
    with pytest.raises(ConfigError, match=r"--vocab-size: must be at least 257"):
        train_bpe([str(tmp_path / "a.txt")], 100, tmp_path / "t.json")
    with pytest.raises(ConfigError, match=r"FILES: '.*missing.txt' is not a file"):
        train_bpe([str(tmp_path / "missing.txt")], 300, tmp_path / "t.json")


def test_load_tokenizer_takes_bytes_or_a_tokenizer_json(tmp_path, bpe_file):
    assert isinstance(load_tokenizer("bytes"), ByteTokenizer)
    assert load_tokenizer(str(bpe_file)).vocab_size == 400
    with pytest.raises(ConfigError, match=r"data.tokenizer: '.*nope.json' is not a file; give 'bytes'"):
        load_tokenizer(str(tmp_path / "nope.json"))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"data.tokenizer: '.*bad.json' is not a tokenizers tokenizer.json"):
        load_tokenizer(str(tmp_path / "bad.json"))


def test_character_vocabulary_splits_into_single_characters(tmp_path):
    chars = sorted(set("hello world\n\té"))
    stoi = {c: i for i, c in enumerate(chars)}
    tok = char_tokenizer(stoi, "chars")
    text = "hello\n world\té"
    assert tok.encode(text).tolist() == [stoi[c] for c in text]
    assert tok.decode(tok.encode(text)) == text
    assert tok.vocab_size == len(chars) and tok.end_of_text is None
    tok.save(tmp_path / "t.json")  # a tokenizer.json like any other
    assert HFTokenizer.from_file(tmp_path / "t.json").encode(text).tolist() == tok.encode(text).tolist()


def test_token_ids_read_and_write_numbers():
    tok = TokenIds(50257)
    assert tok.encode(" 464  3290 13\n").tolist() == [464, 3290, 13]
    assert tok.decode([464, 3290]) == "464 3290"
    with pytest.raises(ValueError, match="space-separated token ids"):
        tok.encode("The cat")
