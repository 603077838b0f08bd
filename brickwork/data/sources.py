"""Where training text comes from: ``data.path`` (and ``data.val_path``), of a kind detected or set
by ``data.format``, read as token files.

| format   | data.path                                   | read as                                      |
|----------|---------------------------------------------|----------------------------------------------|
| text     | a text file                                 | the file itself (bytes), or tokenised once   |
| folder   | a folder of text files, each one document   | tokenised once into the run's cache          |
| jsonl    | one JSON object per line, text under text_key | tokenised once into the run's cache        |
| bin      | a nanoGPT folder (train.bin, val.bin, meta.pkl) or one .bin file | memory-mapped as it is  |

Tokenising streams into ``RUN/cache/tokens-<key>.bin``, named by a hash of the files (path, size,
modification time), the format, the text key, the tokenizer and ``data.pack``'s end-of-document id, so
a resumed run reuses it. With ``data.pack`` every document of a jsonl or folder source ends with that
id; a .bin source's documents are found by its tokenizer's end-of-text id (brickwork/data/packing.py).
"""

from __future__ import annotations

import codecs
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from brickwork.data.config import FORMATS, DataConfig
from brickwork.data.corpus import read_corpus, split_tokens
from brickwork.data.meta_pickle import load_plain_pickle
from brickwork.data.packing import end_of_document
from brickwork.data.token_file import check_token_ids, map_tokens, token_dtype, write_token_file
from brickwork.data.tokenizer import (
    ByteTokenizer,
    HFTokenizer,
    TokenIds,
    Tokenizer,
    char_tokenizer,
    load_tokenizer,
    tokenizer_digest,
)
from brickwork.errors import ConfigError

# Files that are clearly not text: training on their bytes would be silently wrong.
NOT_TEXT = frozenset(
    {".parquet", ".arrow", ".feather", ".npy", ".npz", ".pkl", ".pickle", ".pt", ".pth", ".safetensors"}
    | {".h5", ".hdf5", ".gz", ".bz2", ".xz", ".zst", ".zip", ".tar", ".7z", ".png", ".jpg", ".jpeg", ".pdf"}
)
DECLARATIONS = ("tokenizer.json", "meta.pkl")  # files a data folder declares its tokenizer with
# A large text file is read and tokenised 1 MiB at a time: a tokenizer's per-token objects for a piece
# take about 10x its size while it is encoded.
PIECE_BYTES = 1 << 20


@dataclass
class TextData:
    """Token streams (1-D, over memory maps for files) and what they are."""

    train: torch.Tensor
    val: torch.Tensor
    tokenizer: Tokenizer
    description: str
    end_id: int | None = None  # the id ending every document, when they are packed (data.pack)


def detect_format(path: Path, given: str, option: str) -> str:
    """The format of ``path``: ``given`` checked against what is there, or detected for ``auto``."""
    if given not in FORMATS:
        raise ConfigError(f"unknown format {given!r}", "data.format", choices=FORMATS, got=given)
    if not path.exists():
        raise ConfigError(f"file or folder {str(path)!r} does not exist", option)
    if path.is_dir():
        found = "bin" if (path / "train.bin").is_file() else "folder"
        if given == "bin" and found == "folder":
            raise ConfigError(f"folder {str(path)!r} has no train.bin", option)
        if given not in ("auto", found):
            raise ConfigError(f"{str(path)!r} is a folder, not a {given} file", option)
        return found
    suffix = path.suffix.lower()
    if given == "auto":
        if suffix in NOT_TEXT:
            raise ConfigError(
                f"unknown format of {str(path)!r} ({suffix} is not text); give a text file, a folder of "
                "them, a .jsonl file or a nanoGPT folder of .bin token files, or set data.format",
                option,
                choices=FORMATS,
            )
        return {".jsonl": "jsonl", ".bin": "bin"}.get(suffix, "text")
    if given == "folder":
        raise ConfigError(f"{str(path)!r} is a file, not a folder", option)
    return given


def declared_tokenizer(path: str | None, given: str | None, spec_vocab: int | None) -> Tokenizer:
    """``data.tokenizer`` when given; else what a data folder (or the folder of a .bin file) declares:
    its tokenizer.json, or a nanoGPT meta.pkl's characters or vocab_size; else bytes for text and
    token ids for .bin data."""
    if given is not None:
        return load_tokenizer(given)
    if path is None:
        return ByteTokenizer()
    root = Path(path).expanduser()
    is_bin = root.suffix == ".bin" or (root / "train.bin").is_file()
    if not (root.is_dir() or is_bin):
        return ByteTokenizer()
    folder = root if root.is_dir() else root.parent
    if (folder / "tokenizer.json").is_file():
        return HFTokenizer.from_file(folder / "tokenizer.json", "data.path")
    meta_file = folder / "meta.pkl"
    if is_bin and meta_file.is_file():
        meta = load_plain_pickle(meta_file)
        if not isinstance(meta, dict) or not isinstance(meta.get("vocab_size"), int):
            raise ConfigError(f"{str(meta_file)!r} holds no integer vocab_size", "data.path")
        if isinstance(meta.get("stoi"), dict):
            return char_tokenizer(meta["stoi"], f"characters of {meta_file} ({meta['vocab_size']} tokens)")
        return TokenIds(meta["vocab_size"])
    if is_bin:
        if spec_vocab is None:
            raise ConfigError(
                f"{path!r} holds token ids and declares no tokenizer (no tokenizer.json or meta.pkl beside "
                "it); set vocab_size in the spec or data.tokenizer",
                "data.tokenizer",
            )
        return TokenIds(spec_vocab)
    return ByteTokenizer()


def open_text_data(data: DataConfig, tokenizer: Tokenizer, cache: Path, seq_len: int) -> TextData:
    """The training and held-out token streams of the ``data:`` section (a DataConfig).

    Held out: ``data.val_path``, else a nanoGPT folder's val.bin, else the last ``val_fraction``.
    Every id of a token file is checked to be below the tokenizer's ``vocab_size``. With ``data.pack``
    the streams' documents end with ``end_id`` (:func:`check_packable`).
    """
    if not data.pack:
        return _open_streams(data, tokenizer, cache, seq_len, None)
    end_id = check_packable(data, tokenizer)
    text = _open_streams(data, tokenizer, cache, seq_len, end_id)
    return replace(
        text, end_id=end_id, description=f"{text.description}; documents packed, each ended by id {end_id}"
    )


def check_packable(data: DataConfig, tokenizer: Tokenizer) -> int:
    """The end-of-document id of a ``data:`` section with ``pack: true``, read from nothing but the
    paths' kinds; ConfigError at ``data.pack`` for data without document boundaries: the embedded
    corpus and a text file (one stream each), or .bin ids whose tokenizer has no end-of-text id."""
    stream = "one stream with no document boundaries; give a .jsonl file (a record per document) or a folder"
    if data.path is None:
        raise ConfigError(f"the embedded corpus is {stream}", "data.pack")
    for option, path in (("data.path", data.path), ("data.val_path", data.val_path)):
        kind = None if path is None else detect_format(Path(path).expanduser(), data.format, option)
        if kind == "text":
            raise ConfigError(f"{option} is a text file, {stream}", "data.pack")
        if kind == "bin" and tokenizer.end_of_text is None:
            raise ConfigError(
                f"{option} holds token ids whose tokenizer ({tokenizer.name}) has no end-of-text id to find "
                "its documents by",
                "data.pack",
            )
    return end_of_document(tokenizer)


def _open_streams(
    data: DataConfig, tokenizer: Tokenizer, cache: Path, seq_len: int, end_id: int | None
) -> TextData:
    unit = "bytes" if isinstance(tokenizer, ByteTokenizer) else "tokens"
    if data.path is None:
        raw, source = read_corpus(None)
        tokens = tokenizer.encode(raw.decode("utf-8"))
        train, val = split_tokens(tokens, data.val_fraction, seq_len, unit, "the embedded corpus")
        return TextData(train, val, tokenizer, f"{source}, {val.numel():,} {unit} held out")
    train, train_val, source = _read(
        Path(data.path).expanduser(), data, tokenizer, cache, "data.path", end_id
    )
    if data.val_path is not None:
        val_path = Path(data.val_path).expanduser()
        val, _, val_source = _read(val_path, data, tokenizer, cache, "data.val_path", end_id)
        _need_window(val, seq_len, "data.val_path", unit)
        _need_window(train, seq_len, "data.path", unit)
        return TextData(train.tokens, val.tokens, tokenizer, f"{source}; held out: {val_source}")
    if train_val is not None:
        _need_window(train, seq_len, "data.path", unit)
        _need_window(train_val, seq_len, "data.path", unit)
        return TextData(train.tokens, train_val.tokens, tokenizer, f"{source}, with its val.bin held out")
    train_part, val = split_tokens(train.tokens, data.val_fraction, seq_len, unit, repr(train.name))
    return TextData(train_part, val, tokenizer, f"{source}, {val.numel():,} {unit} held out")


def data_files(data: DataConfig) -> list[tuple[str, Path]]:
    """(option, file) for every file the streams of the ``data:`` section are read from, listed
    without reading them: those of ``data.path`` (a nanoGPT folder's val.bin only when it is the
    held-out part) and those of ``data.val_path``; none for the embedded corpus. The files a data
    folder declares its tokenizer with belong to the tokenizer, and are not listed."""
    if data.path is None:
        return []
    path = Path(data.path).expanduser()
    files, own_val = _source_files(path, detect_format(path, data.format, "data.path"), "data.path")
    listed = [("data.path", file) for file in files]
    if data.val_path is None:
        return listed + ([("data.path", own_val)] if own_val is not None else [])
    val_path, option = Path(data.val_path).expanduser(), "data.val_path"
    held_out, _ = _source_files(val_path, detect_format(val_path, data.format, option), option)
    return listed + [(option, file) for file in held_out]


class _Stream(NamedTuple):
    """A 1-D token stream and the file it was read from (or tokenised from), as errors name it."""

    tokens: torch.Tensor
    name: str


def _source_files(path: Path, kind: str, option: str) -> tuple[list[Path], Path | None]:
    """(the files ``path`` of format ``kind`` is read from, a nanoGPT folder's val.bin or None)."""
    if kind == "bin":
        if not path.is_dir():
            return [path], None
        val = path / "val.bin"
        return [path / "train.bin"], val if val.is_file() else None
    return (_text_files(path, option) if kind == "folder" else [path]), None


def _read(
    path: Path, data: DataConfig, tokenizer: Tokenizer, cache: Path, option: str, end_id: int | None
) -> tuple[_Stream, _Stream | None, str]:
    """(its token stream, a nanoGPT folder's val.bin stream or None, description) of one source;
    ``end_id`` ends each document of a tokenised source (packed documents)."""
    vocab_size = tokenizer.vocab_size
    kind = detect_format(path, data.format, option)
    files, val_file = _source_files(path, kind, option)
    if kind == "bin":
        dtype = token_dtype(tokenizer.vocab_size, smallest=np.uint16)
        train = _Stream(_map_checked(files[0], dtype, vocab_size, option), str(files[0]))
        val = None
        if val_file is not None:
            val = _Stream(_map_checked(val_file, dtype, vocab_size, option), str(val_file))
        return train, val, f"{path} ({train.tokens.numel():,} {dtype.name} tokens, {tokenizer.name})"
    if kind == "text" and isinstance(tokenizer, ByteTokenizer):
        if path.stat().st_size == 0:
            raise ConfigError(f"file {str(path)!r} is empty; give a text file to train on", option)
        tokens = map_tokens(path, np.dtype(np.uint8), option)
        return _Stream(tokens, str(path)), None, f"{path} ({path.stat().st_size:,} bytes)"
    key = hashlib.sha256(
        json.dumps(
            [kind, data.text_key, [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]]
            + ([] if end_id is None else [end_id])
        ).encode()
        + tokenizer_digest(tokenizer).encode()
    ).hexdigest()[:20]
    out = cache / f"tokens-{key}.bin"
    if not out.is_file():
        pieces = (
            _jsonl_pieces(path, data.text_key, option)
            if kind == "jsonl"
            else _file_pieces(files, tokenizer, option)
        )
        total = sum(f.stat().st_size for f in files)
        if write_token_file(pieces, tokenizer, out, total, path.name, end_id) == 0:
            out.unlink()
            raise ConfigError(f"{str(path)!r} holds no text to train on", option)
    dtype = token_dtype(tokenizer.vocab_size)
    tokens = _map_checked(out, dtype, vocab_size, option)
    what = f"{len(files)} files" if kind == "folder" else kind
    # Errors about these tokens name the source, not the cache file they were tokenised into.
    return _Stream(tokens, str(path)), None, f"{path} ({what}, {tokens.numel():,} tokens of {tokenizer.name})"


def _map_checked(file: Path, dtype: np.dtype, vocab_size: int, option: str) -> torch.Tensor:
    tokens = map_tokens(file, dtype, option)
    check_token_ids(file, dtype, vocab_size, option)
    return tokens


def _need_window(stream: _Stream, seq_len: int, option: str, unit: str) -> None:
    if stream.tokens.numel() < seq_len + 1:
        raise ConfigError(
            f"{stream.name!r} holds {stream.tokens.numel():,} {unit}, fewer than train.seq_len + 1 = "
            f"{seq_len + 1}: too short for one window; give a longer file or a smaller train.seq_len",
            option,
        )


def _text_files(folder: Path, option: str) -> list[Path]:
    """Every non-hidden file under ``folder`` but the tokenizer declarations, in sorted order."""
    files = sorted(
        f
        for f in folder.rglob("*")
        if f.is_file()
        and not any(part.startswith(".") for part in f.relative_to(folder).parts)
        and f.name not in DECLARATIONS
    )
    if not any(f.stat().st_size for f in files):
        raise ConfigError(f"folder {str(folder)!r} holds no text files (or only empty ones)", option)
    for f in files:
        if f.suffix.lower() in NOT_TEXT:
            raise ConfigError(
                f"unknown format of {str(f)!r} in the folder ({f.suffix} is not text); a folder source "
                "holds text files only",
                option,
            )
    return files


def _file_pieces(files: list[Path], tokenizer: Tokenizer, option: str) -> Iterator[tuple[str | bytes, bool]]:
    """Each file in pieces of about PIECE_BYTES: raw bytes for the byte tokenizer (any encoding), else
    UTF-8 text (strictly) cut at line ends, so that a line is never split between two pieces."""
    as_text = not isinstance(tokenizer, ByteTokenizer)
    for file in files:
        decoder = codecs.getincrementaldecoder("utf-8")()
        offset, rest = 0, ""
        with open(file, "rb") as handle:
            while block := handle.read(PIECE_BYTES):
                if not as_text:
                    yield block, False
                    continue
                try:
                    text = rest + decoder.decode(block, final=len(block) < PIECE_BYTES)
                except UnicodeDecodeError as err:
                    raise ConfigError(
                        f"{str(file)!r} is not UTF-8 text (byte {offset + err.start:,}); the byte tokenizer "
                        "(data.tokenizer=bytes) reads any encoding",
                        option,
                    ) from None
                offset += len(block)
                # A line longer than a piece (a file with no line ends) is cut where the piece ends.
                cut = text.rfind("\n") + 1 or len(text)
                text, rest = text[:cut], text[cut:]
                yield text, False
        yield (rest if as_text else b""), True


def _jsonl_pieces(path: Path, key: str, option: str) -> Iterator[tuple[str, bool]]:
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except ValueError as err:  # JSONDecodeError, or UnicodeDecodeError for bytes not in UTF-8
                raise ConfigError(f"line {number} of {str(path)!r} is not JSON: {err}", option) from None
            if not isinstance(record, dict) or key not in record:
                keys = ", ".join(map(str, record)) if isinstance(record, dict) else type(record).__name__
                raise ConfigError(
                    f"line {number} of {str(path)!r} has no {key!r} key (it has: {keys}); "
                    "set data.text_key to the key that holds the text",
                    "data.text_key",
                )
            if not isinstance(record[key], str):
                raise ConfigError(
                    f"line {number} of {str(path)!r}: {key!r} holds a {type(record[key]).__name__}, not text",
                    "data.text_key",
                )
            yield record[key], True
