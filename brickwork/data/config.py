"""The ``data:`` section of a run config, a strictly checked dataclass: what to train on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from brickwork.checks import Flag, InRange, OneOf, check_non_empty
from brickwork.option_types import CheckedConfig

# The kinds of data.path that brickwork/data/sources.py reads.
FORMATS = ("auto", "text", "folder", "jsonl", "bin")


@dataclass(frozen=True)
class DataConfig(CheckedConfig):
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
    format: Annotated[str, OneOf(FORMATS)] = "auto"
    text_key: Annotated[str, check_non_empty] = "text"
    tokenizer: str | None = None
    val_path: str | None = None
    val_fraction: Annotated[float, InRange(0, 0.5, open_low=True)] = 0.1
    pack: Flag = False
