"""A byte-level BPE learnt once from the embedded corpus, for the data tests."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from brickwork.data.bpe_training import train_bpe
from brickwork.data.tokenizer import HFTokenizer


@pytest.fixture(scope="session")
def bpe_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    corpus = resources.files("brickwork.data").joinpath("corpus.txt")
    out = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    train_bpe([str(corpus)], 400, out)
    return out


@pytest.fixture
def bpe(bpe_file: Path) -> HFTokenizer:
    return HFTokenizer.from_file(bpe_file)
