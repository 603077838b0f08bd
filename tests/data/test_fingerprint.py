"""The bounded fingerprint of a data file: the size and three samples, never the whole of a large file."""

from __future__ import annotations

import io

from brickwork.data.fingerprint import SAMPLE_BYTES, fingerprint, sample_offsets


class CountingReader(io.BytesIO):
    """A file in memory that counts the bytes read from it."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.bytes_read = 0

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        self.bytes_read += len(chunk)
        return chunk


def changed(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :]


def test_a_large_file_is_read_in_three_samples_and_an_edit_in_any_of_them_is_seen() -> None:
    data = bytes(range(256)) * (40 * SAMPLE_BYTES // 256) + b"tail"
    reader = CountingReader(data)
    size, digest = fingerprint(reader)
    assert size == len(data) and reader.bytes_read == 3 * SAMPLE_BYTES
    starts = sample_offsets(len(data))
    assert starts == [0, (len(data) - SAMPLE_BYTES) // 2, len(data) - SAMPLE_BYTES]
    for at in (0, starts[1] + 5, len(data) - 1):
        assert fingerprint(io.BytesIO(changed(data, at)))[1] != digest, at
    assert fingerprint(io.BytesIO(data + b"!"))[0] == len(data) + 1
    # The bound: an edit that keeps the size and misses every sample goes unseen.
    assert fingerprint(io.BytesIO(changed(data, SAMPLE_BYTES + 7))) == (size, digest)


def test_a_file_of_at_most_three_samples_is_read_whole() -> None:
    data = b"x" * (3 * SAMPLE_BYTES)
    reader = CountingReader(data)
    assert fingerprint(reader)[0] == len(data) and reader.bytes_read == len(data)
    assert all(
        fingerprint(io.BytesIO(changed(data, at)))[1] != fingerprint(io.BytesIO(data))[1]
        for at in (0, 100_000)
    )
    assert fingerprint(io.BytesIO(b""))[0] == 0
