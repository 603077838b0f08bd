"""A byte-level tokenizer: every UTF-8 byte is one token, so any text encodes with no download."""

from __future__ import annotations

import torch


class ByteTokenizer:
    """Maps text to its UTF-8 bytes (ids 0..255) and back.

    Decoding replaces a cut multi-byte character with U+FFFD instead of failing, since a model may
    generate any byte sequence.
    """

    vocab_size = 256

    def encode(self, text: str | bytes) -> torch.Tensor:
        """text (str, taken as UTF-8, or raw bytes) -> LongTensor[N] of byte ids."""
        data = bytearray(text.encode("utf-8") if isinstance(text, str) else text)
        if not data:
            return torch.empty(0, dtype=torch.long)
        return torch.frombuffer(data, dtype=torch.uint8).long()

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        """LongTensor[N] or list of ids in 0..255 -> text."""
        values = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        bad = [v for v in values if not 0 <= v < self.vocab_size]
        if bad:
            raise ValueError(f"byte token ids must be in 0..255, got {bad[0]}")
        return bytes(values).decode("utf-8", errors="replace")
