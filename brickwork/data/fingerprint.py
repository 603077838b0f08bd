"""A bounded fingerprint of a data file: how a resumed run notices data replaced under it.

Hashing a 100 GB token file whole on every resume would take minutes, so the fingerprint reads at
most three samples of SAMPLE_BYTES each, at fixed places: the start, the middle and the end of the
file (a file of at most three samples is read whole). Their SHA-256, together with the size, is the
fingerprint. It is not a full hash: an edit that keeps the size and falls outside the samples goes
unseen. A file replaced by another (new text, a re-tokenised corpus, a truncated or appended copy)
changes the size or a sample.
"""

from __future__ import annotations

import hashlib
import os
from typing import BinaryIO

SAMPLE_BYTES = 1 << 16  # 64 KiB: one read per sample, 192 KiB per file at most


def sample_offsets(size: int) -> list[int]:
    """Where the samples of a ``size``-byte file start: one at 0 for a file of at most three samples
    (read whole), else the start, the middle and the end."""
    if size <= 3 * SAMPLE_BYTES:
        return [0]
    return [0, (size - SAMPLE_BYTES) // 2, size - SAMPLE_BYTES]


def fingerprint(handle: BinaryIO) -> tuple[int, str]:
    """(size in bytes, SHA-256 hex of the size and the samples) of the seekable binary file ``handle``."""
    size = handle.seek(0, os.SEEK_END)
    digest = hashlib.sha256(size.to_bytes(8, "little"))
    whole = size <= 3 * SAMPLE_BYTES
    for offset in sample_offsets(size):
        handle.seek(offset)
        digest.update(handle.read(size if whole else SAMPLE_BYTES))
    return size, digest.hexdigest()
