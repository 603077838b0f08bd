"""The ``data:`` section of a run config, a strictly checked dataclass: what to train on."""

from __future__ import annotations

from dataclasses import dataclass

from brickwork.checks import check_bool, check_choice
from brickwork.errors import ConfigError

# The kinds of data.path that brickwork/data/sources.py reads.
FORMATS = ("auto", "text", "folder", "jsonl", "bin")


@dataclass
class DataConfig:
    """What to train on (brickwork/data/sources.py).

    ``path``: a text file, a folder of text files, a .jsonl file or a nanoGPT folder of .bin token
    files (None = the embedded corpus), its kind detected or set by ``format``; ``text_key``: the
    jsonl field holding the text; ``tokenizer``: ``bytes`` or a tokenizer.json path (None = what the
    data folder declares, else bytes); ``val_path``: held-out data of the same kinds, else a nanoGPT
    folder's val.bin, else the last ``val_fraction`` of the data; ``pack``: causal-LM windows of whole
    documents end to end, each followed by the end-of-document id, attending within their own
    document with positions restarting at 0 (jsonl and folder sources, or .bin ids whose tokenizer has
    an end-of-text id; brickwork/data/packing.py).
    """

    path: str | None = None
    format: str = "auto"
    text_key: str = "text"
    tokenizer: str | None = None
    val_path: str | None = None
    val_fraction: float = 0.1
    pack: bool = False

    def __post_init__(self) -> None:
        check_bool(self.pack, "pack")
        if not 0 < self.val_fraction <= 0.5:
            raise ConfigError(f"must be in (0, 0.5], got {self.val_fraction!r}", "val_fraction")
        check_choice(self.format, "format", FORMATS)
        if not self.text_key:
            raise ConfigError(f"must be non-empty, got {self.text_key!r}", "text_key")
