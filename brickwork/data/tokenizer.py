"""Tokenizers a run can use: bytes (no download, 256 ids), an HF ``tokenizers`` tokenizer.json, a
nanoGPT character vocabulary, or bare token ids when the data declares no text form.

Each has ``vocab_size``, ``encode(text) -> LongTensor[N]``, ``decode(ids) -> str`` and ``name`` (what a
run prints); ``end_of_text`` is the id that separates documents, or None to separate them by a blank
line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

import torch

from brickwork.errors import ConfigError
from brickwork.extras import missing_package

# The special token brickwork's own BPE training adds, as GPT-2's vocabulary has it.
END_OF_TEXT = "<|endoftext|>"


class Tokenizer(Protocol):
    vocab_size: int
    name: str
    end_of_text: int | None

    def encode(self, text: str) -> torch.Tensor: ...

    def decode(self, ids: torch.Tensor | list[int]) -> str: ...


class ByteTokenizer:
    """Maps text to its UTF-8 bytes (ids 0..255) and back.

    Decoding replaces a cut multi-byte character with U+FFFD instead of failing, since a model may
    generate any byte sequence.
    """

    vocab_size = 256
    name = "bytes"
    end_of_text = None

    def encode(self, text: str | bytes) -> torch.Tensor:
        """text (str, taken as UTF-8, or raw bytes) -> LongTensor[N] of byte ids."""
        data = bytearray(text.encode("utf-8") if isinstance(text, str) else text)
        if not data:
            return torch.empty(0, dtype=torch.long)
        return torch.frombuffer(data, dtype=torch.uint8).long()

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        """LongTensor[N] or list of ids in 0..255 -> text."""
        values = _ids(ids)
        bad = [v for v in values if not 0 <= v < self.vocab_size]
        if bad:
            raise ValueError(f"byte token ids must be in 0..255, got {bad[0]}")
        return bytes(values).decode("utf-8", errors="replace")


class HFTokenizer:
    """A HF ``tokenizers.Tokenizer`` (a tokenizer.json) behind the interface above."""

    def __init__(self, tokenizer, name: str) -> None:  # tokenizers.Tokenizer: an optional dependency
        self.tokenizer = tokenizer
        self.name = name
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.end_of_text = tokenizer.token_to_id(END_OF_TEXT)

    @classmethod
    def from_file(cls, path: str | Path, option: str = "data.tokenizer") -> HFTokenizer:
        tokenizers = require_tokenizers(option)
        file = Path(path).expanduser()
        if not file.is_file():
            raise ConfigError(
                f"{str(file)!r} is not a file; give 'bytes' or the path of a tokenizer.json", option
            )
        try:
            loaded = tokenizers.Tokenizer.from_file(str(file))
        except Exception as err:  # the Rust parser reports any malformed file as a plain Exception
            raise ConfigError(f"{str(file)!r} is not a tokenizers tokenizer.json: {err}", option) from None
        return cls(loaded, f"{file} ({loaded.get_vocab_size(with_added_tokens=True):,} tokens)")

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor(self.encode_batch([text])[0], dtype=torch.long)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Many texts at once, on the library's own threads."""
        try:  # the fast variant skips the character offsets, which nothing here reads
            encoded = self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        except Exception as err:  # e.g. a character vocabulary meeting a character it lacks
            raise ValueError(f"the tokenizer {self.name} cannot encode the text: {err}") from None
        return [e.ids for e in encoded]

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        return self.tokenizer.decode(_ids(ids), skip_special_tokens=False)

    def save(self, path: Path) -> None:
        self.tokenizer.save(str(path))


class TokenIds:
    """Token data with no text form declared: prompts and samples are space-separated ids."""

    end_of_text = None

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.name = f"token ids (no tokenizer declared; vocab_size {vocab_size:,})"

    def encode(self, text: str) -> torch.Tensor:
        try:
            ids = [int(word) for word in text.split()]
        except ValueError:
            raise ValueError(
                f"without a tokenizer a prompt is space-separated token ids, got {text[:40]!r}"
            ) from None
        return torch.tensor(ids, dtype=torch.long)

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        return " ".join(str(v) for v in _ids(ids))


def char_tokenizer(stoi: dict[str, int], name: str) -> HFTokenizer:
    """nanoGPT's character vocabulary (``meta.pkl``'s ``stoi``) as a tokenizers WordLevel model that
    splits text into single characters, so it saves as a tokenizer.json like any other."""
    tokenizers = require_tokenizers("data.path")
    model = tokenizers.models.WordLevel(vocab=dict(stoi), unk_token=None)
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Split(
        tokenizers.Regex(r"[\s\S]"), behavior="isolated"
    )
    tokenizer.decoder = tokenizers.decoders.Fuse()
    return HFTokenizer(tokenizer, name)


def load_tokenizer(value: str, option: str = "data.tokenizer") -> Tokenizer:
    """``"bytes"`` or the path of a tokenizer.json."""
    if value == "bytes":
        return ByteTokenizer()
    return HFTokenizer.from_file(value, option)


def require_tokenizers(option: str):
    try:
        import tokenizers
    except ImportError:
        raise ConfigError(missing_package("tokenizers", "a tokenizer other than bytes"), option) from None
    return tokenizers


def tokenizer_digest(tokenizer: Tokenizer) -> str:
    """Text that changes whenever the ids the tokenizer gives change: part of the token cache's key,
    and what a run's data.json hashes to recognise its tokenizer."""
    if isinstance(tokenizer, HFTokenizer):
        return tokenizer.tokenizer.to_str()
    return json.dumps([type(tokenizer).__name__, tokenizer.vocab_size])


def _ids(ids: torch.Tensor | list[int]) -> list[int]:
    return ids.tolist() if isinstance(ids, torch.Tensor) else [int(v) for v in ids]
