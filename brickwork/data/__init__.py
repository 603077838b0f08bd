"""Training data: the embedded corpus, a byte-level tokenizer, a held-out split and seeded batches."""

from brickwork.data.corpus import RandomWindows, fixed_windows, read_corpus, split_tokens
from brickwork.data.tokenizer import ByteTokenizer

__all__ = ["ByteTokenizer", "RandomWindows", "fixed_windows", "read_corpus", "split_tokens"]
