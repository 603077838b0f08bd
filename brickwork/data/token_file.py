"""Token files: flat arrays of token ids on disk, memory-mapped and read window by window.

A nanoGPT ``train.bin`` is one (uint16 ids, uint32 for vocabularies above 65,536); a text source is
tokenised once into one, streamed chunk by chunk, so memory never grows with the data. Reading maps
the file (``numpy.memmap``, copy-on-write so torch may wrap it) and touches only the windows a batch
draws; checking every id against the vocabulary reads the file in blocks through ordinary reads,
which the page cache holds, not the process.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from brickwork.data.tokenizer import HFTokenizer, Tokenizer
from brickwork.errors import ConfigError

CHECK_BLOCK = 1 << 22  # ids per block of the vocabulary check (8 MiB of uint16)


def token_dtype(vocab_size: int, smallest: type[np.unsignedinteger] = np.uint8) -> np.dtype:
    """The narrowest of uint8 (from ``smallest``), uint16, uint32 that holds ids below ``vocab_size``."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if np.dtype(dtype).itemsize >= np.dtype(smallest).itemsize and vocab_size <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype)
    raise ConfigError(f"a vocabulary of {vocab_size:,} ids does not fit uint32 token files", "vocab_size")


def map_tokens(path: Path, dtype: np.dtype, option: str) -> torch.Tensor:
    """The ids in ``path`` as a 1-D tensor over a memory map of the file (nothing is read yet)."""
    size = path.stat().st_size
    if size == 0:
        raise ConfigError(f"token file {str(path)!r} is empty", option)
    if size % dtype.itemsize:
        raise ConfigError(
            f"token file {str(path)!r} has {size:,} bytes, not a whole number of {dtype.name} ids "
            f"({dtype.itemsize} bytes each): it is truncated or holds another type",
            option,
        )
    mapped = np.memmap(path, dtype=dtype, mode="c")  # copy-on-write: writable for torch, file untouched
    return torch.from_numpy(mapped)


def check_token_ids(path: Path, dtype: np.dtype, vocab_size: int, option: str) -> None:
    """Raise a ConfigError naming the file, the position and the id of the first id >= vocab_size."""
    if vocab_size > np.iinfo(dtype).max:
        return  # every value the file can hold is a valid id
    buffer = np.empty(CHECK_BLOCK, dtype=dtype)  # one buffer for every block: memory stays flat
    offset = 0
    with open(path, "rb") as handle:
        while count := handle.readinto(memoryview(buffer).cast("B")) // dtype.itemsize:
            block = buffer[:count]
            if block.max() >= vocab_size:  # max first: no mask array for the blocks that pass
                at = int(np.argmax(block >= vocab_size))
                raise ConfigError(
                    f"token file {str(path)!r} holds id {int(block[at])} at position {offset + at:,}, but "
                    f"vocab_size is {vocab_size:,} (ids 0..{vocab_size - 1}); give the model a larger "
                    "vocab_size or the tokenizer that wrote the file",
                    option,
                )
            offset += count


def write_token_file(
    documents: Iterable[tuple[str | bytes, bool]],
    tokenizer: Tokenizer,
    out: Path,
    total_bytes: int,
    label: str,
    end_id: int | None = None,
) -> int:
    """Tokenise ``documents`` into the token file ``out``; returns the number of ids written.

    ``documents`` yields (piece, ends_a_document) in order; a document may come in many pieces. The
    tokenizer's end-of-text id, or else a blank line, follows every document but the last; with
    ``end_id`` (packed documents) that id follows every document, the last too, and a document that
    holds it itself raises ConfigError (at ``data.pack``). The file appears only when complete
    (written beside it, then renamed), so a cut-off run leaves none.
    """
    dtype = token_dtype(tokenizer.vocab_size)
    partial = out.with_name(out.name + f".{os.getpid()}.partial")
    out.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    pending_separator = False
    bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc=f"tokenizing {label}", disable=None)
    try:
        with open(partial, "wb") as handle:
            for piece, ends in documents:
                ids = _encode(tokenizer, piece, pending_separator and end_id is None)
                if end_id is not None:
                    _check_no_end(ids, end_id, label)
                    ids += [end_id] if ends else []
                np.asarray(ids, dtype=dtype).tofile(handle)
                written += len(ids)
                pending_separator = ends
                bar.update(len(piece.encode("utf-8")) if isinstance(piece, str) else len(piece))
        os.replace(partial, out)
    finally:
        bar.close()
        partial.unlink(missing_ok=True)
    return written


def _check_no_end(ids: list[int], end_id: int, label: str) -> None:
    """Ids are the document boundaries: one inside a document would split it silently."""
    if end_id in ids:
        raise ConfigError(
            f"{label} holds the end-of-document id {end_id} inside a document (for bytes: a NUL byte, as "
            "UTF-16 text has); packed documents need text without it",
            "data.pack",
        )


def _encode(tokenizer: Tokenizer, piece: str | bytes, separated: bool) -> list[int]:
    """The ids of ``piece``, behind the separator that ends the previous document when ``separated``."""
    head = []
    if separated:
        if tokenizer.end_of_text is not None:
            head = [tokenizer.end_of_text]
        else:
            piece = (b"\n\n" if isinstance(piece, bytes) else "\n\n") + piece
    if isinstance(tokenizer, HFTokenizer):
        # Line by line, on the library's threads: byte-level pre-tokenizers split at line ends anyway
        # (only a run of blank lines, one id when encoded whole, becomes one id per line end).
        ids = [i for line in tokenizer.encode_batch(piece.splitlines(keepends=True)) for i in line]
    else:
        ids = tokenizer.encode(piece).tolist()
    return head + ids
