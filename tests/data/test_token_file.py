"""Token files: the id type, the vocabulary check across blocks, and writes that appear only whole."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from brickwork.data import token_file
from brickwork.data.token_file import check_token_ids, map_tokens, token_dtype, write_token_file
from brickwork.data.tokenizer import ByteTokenizer
from brickwork.errors import ConfigError


def test_the_narrowest_type_that_holds_the_vocabulary():
    assert token_dtype(256) == np.uint8 and token_dtype(257) == np.uint16
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32
    assert token_dtype(100, smallest=np.uint16) == np.uint16  # nanoGPT's .bin files start at uint16


def test_the_vocabulary_check_finds_the_first_bad_id_in_any_block(tmp_path, monkeypatch):
    monkeypatch.setattr(token_file, "CHECK_BLOCK", 7)
    ids = np.arange(100, dtype=np.uint32) % 50
    ids[60] = 90
    ids[80] = 99
    ids.tofile(tmp_path / "t.bin")
    with pytest.raises(
        ConfigError, match=r"x: token file .* holds id 90 at position 60, but vocab_size is 50"
    ):
        check_token_ids(tmp_path / "t.bin", np.dtype(np.uint32), 50, "x")
    check_token_ids(tmp_path / "t.bin", np.dtype(np.uint32), 100, "x")


def test_mapped_tokens_read_the_file_without_copying_it(tmp_path):
    np.arange(1000, dtype=np.uint16).tofile(tmp_path / "t.bin")
    tokens = map_tokens(tmp_path / "t.bin", np.dtype(np.uint16), "x")
    assert tokens.dtype == torch.uint16 and tokens[[5, 999]].long().tolist() == [5, 999]
    tokens[0] = 7  # copy-on-write: the file keeps its ids
    assert np.fromfile(tmp_path / "t.bin", dtype=np.uint16)[0] == 0


def test_a_failed_write_leaves_no_file(tmp_path):
    def pieces():
        yield b"first document", True
        raise ValueError("the source broke")

    with pytest.raises(ValueError, match="the source broke"):
        write_token_file(pieces(), ByteTokenizer(), tmp_path / "t.bin", 100, "t")
    assert list(tmp_path.iterdir()) == []
    count = write_token_file(iter([(b"ab", True), (b"c", True)]), ByteTokenizer(), tmp_path / "t.bin", 3, "t")
    assert np.fromfile(tmp_path / "t.bin", dtype=np.uint8).tolist() == list(b"ab\n\nc") and count == 5
