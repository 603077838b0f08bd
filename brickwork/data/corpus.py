"""Training text as byte tokens: the embedded corpus or a user's file, a held-out split, batches."""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from brickwork.data.task_batches import windows
from brickwork.errors import ConfigError

if TYPE_CHECKING:  # importlib.resources.abc is Python 3.11's; the annotation alone needs it
    from importlib.resources.abc import Traversable

EMBEDDED_CORPUS = "corpus.txt"


def embedded_corpus() -> Traversable:
    """The corpus shipped inside the package (``brickwork/data/corpus.txt``)."""
    return resources.files("brickwork.data").joinpath(EMBEDDED_CORPUS)


def read_corpus(path: str | None = None) -> tuple[bytes, str]:
    """The raw bytes to train on and a short description of where they came from.

    ``path=None`` reads the corpus shipped inside the package. A user's file is read as bytes, so any
    encoding works with the byte-level tokenizer.
    """
    if path is None:
        data = embedded_corpus().read_bytes()
        return data, f"embedded corpus ({len(data):,} bytes of generated tales)"
    file = Path(path).expanduser()
    if not file.exists():
        raise ConfigError(f"file {str(file)!r} does not exist; give a path to a text file", "data.path")
    if not file.is_file():
        raise ConfigError(f"{str(file)!r} is not a file; give a path to a text file", "data.path")
    data = file.read_bytes()
    if not data:
        raise ConfigError(f"file {str(file)!r} is empty; give a text file to train on", "data.path")
    return data, f"{file} ({len(data):,} bytes)"


def split_tokens(
    tokens: torch.Tensor, val_fraction: float, seq_len: int, unit: str = "bytes", source: str = "the text"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split LongTensor[N] into (train, held-out): the last ``val_fraction`` is held out.

    Both parts must hold at least one window of ``seq_len + 1`` tokens (inputs and shifted labels);
    ``unit`` names the tokens and ``source`` (e.g. the quoted file name) the text in the error message.
    """
    if not 0.0 < val_fraction <= 0.5:
        raise ConfigError(f"must be in (0, 0.5], got {val_fraction!r}", "data.val_fraction")
    window = seq_len + 1
    n = tokens.numel()
    n_val = max(math.ceil(n * val_fraction), window)
    if n - n_val < window:
        raise ConfigError(
            f"{source} has {n:,} {unit}, too short for train.seq_len={seq_len}: the training part and the "
            f"held-out part (data.val_fraction={val_fraction}) each need {window} {unit}, so at least "
            f"{2 * window:,} {unit} in all; give a longer file or a smaller train.seq_len",
            "data.path",
        )
    return tokens[: n - n_val], tokens[n - n_val :]


class RandomWindows:
    """Batches of windows at random offsets of a token stream, drawn from its own seeded generator.

    The generator's state is the whole data position, so saving it with a checkpoint makes a resumed
    run draw exactly the batches the uninterrupted run would have drawn.
    """

    def __init__(self, tokens: torch.Tensor, batch_size: int, seq_len: int, seed: int) -> None:
        if tokens.numel() < seq_len + 1:
            raise ValueError(f"need at least seq_len + 1 = {seq_len + 1} tokens, got {tokens.numel()}")
        self.tokens = tokens
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.generator = torch.Generator().manual_seed(seed)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, labels), both LongTensor[batch_size, seq_len]; labels are inputs shifted by one."""
        w = windows(self.tokens, self.batch_size, self.seq_len + 1, self.generator)
        return w[:, :-1], w[:, 1:]

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.generator.set_state(state["generator"])


def fixed_windows(tokens: torch.Tensor, count: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` evenly spaced windows over ``tokens`` for evaluation, the same in every run.

    Returns (input_ids, labels), LongTensor[count, seq_len]; fewer windows when the stream is short.
    """
    last_start = tokens.numel() - seq_len - 1
    if last_start < 0:
        raise ValueError(f"need at least seq_len + 1 = {seq_len + 1} tokens, got {tokens.numel()}")
    # float64: float32 cannot tell starts apart past 2**24 tokens, and rounds the last one out of range.
    count = min(count, last_start + 1)
    starts = torch.linspace(0, last_start, count, dtype=torch.float64).round().long().unique()
    windows = tokens[starts[:, None] + torch.arange(seq_len + 1)].long()
    return windows[:, :-1], windows[:, 1:]
