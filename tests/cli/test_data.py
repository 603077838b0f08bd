"""The embedded corpus, the byte-level tokenizer, the held-out split and the seeded batches."""

from __future__ import annotations

from importlib import resources

import pytest
import torch

from brickwork.data import ByteTokenizer, RandomWindows, fixed_windows, read_corpus, split_tokens
from brickwork.data.tales import generate_tales
from brickwork.errors import ConfigError


def test_shipped_corpus_is_exactly_the_generator_output():
    shipped = resources.files("brickwork.data").joinpath("corpus.txt").read_text(encoding="utf-8")
    assert shipped == generate_tales()
    assert 100_000 < len(shipped.encode()) < 400_000


def test_tokenizer_round_trips_any_text_through_bytes():
    tok = ByteTokenizer()
    text = "Tale 1: Ada — naïve café, 3 € \n\t日本"
    ids = tok.encode(text)
    assert ids.dtype == torch.long
    assert ids.tolist() == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.encode(text.encode("utf-8")).tolist() == ids.tolist()
    assert tok.encode("").numel() == 0


def test_tokenizer_decodes_cut_characters_and_rejects_ids_out_of_range():
    tok = ByteTokenizer()
    cut = tok.encode("é")[:1]
    assert tok.decode(cut) == "\ufffd"
    with pytest.raises(ValueError, match=r"0\.\.255, got 256"):
        tok.decode([65, 256])


def test_split_holds_out_the_tail():
    tokens = torch.arange(1000)
    train, val = split_tokens(tokens, 0.1, seq_len=16)
    assert train.tolist() == list(range(900))
    assert val.tolist() == list(range(900, 1000))
    # The held-out part is never shorter than one window.
    train, val = split_tokens(torch.arange(100), 0.1, seq_len=30)
    assert val.numel() == 31 and train.numel() == 69


def test_split_of_too_short_text_names_the_fix():
    with pytest.raises(
        ConfigError, match=r"data.path: the text has 100 bytes, too short for train.seq_len=64.*130 bytes"
    ):
        split_tokens(torch.arange(100), 0.1, seq_len=64)
    # The minimum it names is enough.
    train, val = split_tokens(torch.arange(130), 0.1, seq_len=64)
    assert train.numel() == val.numel() == 65
    with pytest.raises(ConfigError, match=r"data.val_fraction: must be in \(0, 0.5\]"):
        split_tokens(torch.arange(100), 0.7, seq_len=4)


def test_user_files_missing_empty_or_a_folder(tmp_path):
    with pytest.raises(ConfigError, match=r"data.path: file .*nope.txt' does not exist"):
        read_corpus(str(tmp_path / "nope.txt"))
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ConfigError, match=r"data.path: file .*empty.txt' is empty"):
        read_corpus(str(tmp_path / "empty.txt"))
    with pytest.raises(ConfigError, match="is not a file"):
        read_corpus(str(tmp_path))
    (tmp_path / "mine.txt").write_bytes(b"\xff\xfe latin-1 \xe9 is fine")
    data, source = read_corpus(str(tmp_path / "mine.txt"))
    assert data == b"\xff\xfe latin-1 \xe9 is fine" and "mine.txt" in source


def test_embedded_corpus_reads_from_the_package():
    data, source = read_corpus(None)
    assert data.startswith(b"Tale 1: ") and "embedded corpus" in source


def test_batches_are_shifted_windows_of_the_stream():
    tokens = torch.arange(500)
    x, y = RandomWindows(tokens, batch_size=8, seq_len=16, seed=0).next_batch()
    assert x.shape == y.shape == (8, 16)
    # Consecutive integers: each window is contiguous and labels are the next token.
    assert torch.equal(y, x + 1)
    assert torch.equal(x[:, 1:], x[:, :-1] + 1)
    assert int(x.max()) <= 498


def test_batches_depend_only_on_the_seed_and_resume_from_their_state():
    tokens = torch.arange(10_000)
    a = RandomWindows(tokens, 4, 8, seed=3)
    b = RandomWindows(tokens, 4, 8, seed=3)
    first = [a.next_batch()[0] for _ in range(3)]
    assert all(torch.equal(f, b.next_batch()[0]) for f in first)
    saved = a.state_dict()
    expected = [a.next_batch()[0] for _ in range(3)]
    c = RandomWindows(tokens, 4, 8, seed=99)
    c.load_state_dict(saved)
    assert all(torch.equal(e, c.next_batch()[0]) for e in expected)
    assert not torch.equal(RandomWindows(tokens, 4, 8, seed=4).next_batch()[0], first[0])


def test_fixed_windows_span_the_held_out_part_evenly():
    x, y = fixed_windows(torch.arange(1000), count=5, seq_len=10)
    assert x[:, 0].tolist() == [0, 247, 494, 742, 989]
    assert torch.equal(y, x + 1)
    x, _ = fixed_windows(torch.arange(13), count=8, seq_len=10)
    assert x[:, 0].tolist() == [0, 1, 2]


def test_fixed_windows_over_a_validation_split_past_2_to_the_24_tokens() -> None:
    """float32 cannot hold every start past 2**24; the last window must still end at the last token."""
    tokens = torch.arange(2**24 + 40) % 251
    inputs, labels = fixed_windows(tokens, 4, 32)
    last_start = tokens.numel() - 33
    assert inputs.shape == (4, 32) and labels.shape == (4, 32)
    assert torch.equal(inputs[-1], tokens[last_start : last_start + 32])
    assert torch.equal(labels[-1], tokens[last_start + 1 :])
