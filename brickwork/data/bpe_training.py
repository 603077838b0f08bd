"""Training a byte-level BPE tokenizer (GPT-2's kind) on the user's own files, offline.

The ``tokenizers`` library does the work: its ByteLevel pre-tokenizer maps every byte to a symbol, so
any text encodes without an unknown token, and its BpeTrainer learns merges up to ``vocab_size``. The
result is a tokenizer.json that ``data.tokenizer`` takes and that HF transformers loads too.
"""

from __future__ import annotations

from pathlib import Path

from brickwork.data.tokenizer import END_OF_TEXT, HFTokenizer, require_tokenizers
from brickwork.errors import ConfigError

BYTE_ALPHABET = 256


def train_bpe(files: list[str], vocab_size: int, out: str | Path, min_frequency: int = 2) -> HFTokenizer:
    """Learn a byte-level BPE of at most ``vocab_size`` ids (the 256 bytes, ``<|endoftext|>`` and
    merges) from the text ``files`` and save it as ``out`` (a tokenizer.json). Merges stop early when
    no pair is left that occurs ``min_frequency`` times."""
    tokenizers = require_tokenizers("--vocab-size")
    if vocab_size < BYTE_ALPHABET + 1:
        raise ConfigError(
            f"must be at least {BYTE_ALPHABET + 1} (the 256 bytes and {END_OF_TEXT}), got {vocab_size}",
            "--vocab-size",
        )
    for name in files:
        if not Path(name).is_file():
            raise ConfigError(f"{name!r} is not a file", "FILES")
    target = Path(out)
    if target.is_dir():
        raise ConfigError(f"{out!r} is a folder; give the name of the file to write", "-o")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    try:
        tokenizer.train([str(Path(f)) for f in files], trainer)
    except Exception as err:  # the library reports unreadable (e.g. non-UTF-8) files as plain Exceptions
        raise ConfigError(f"training failed on {', '.join(files)}: {err}", "FILES") from None
    target.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(target))
    return HFTokenizer(tokenizer, str(target))
