"""data.json: what a run's data is made of, and how a resume compares it with the data now."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from brickwork.data.config import DataConfig
from brickwork.data.tokenizer import ByteTokenizer, TokenIds
from brickwork.errors import ConfigError
from brickwork.train.data_identity import DataIdentity, check_data_identity, current_record


def recorded(run: Path, data: DataConfig, tokenizer=None) -> dict:
    """The record a new run in ``run`` writes for ``data``."""
    run.mkdir(exist_ok=True)
    identity = check_data_identity(
        run, current_record(data, tokenizer or ByteTokenizer()), tokenizer, None, False
    )
    identity.save(run)
    return identity.record


def test_the_embedded_corpus_and_generated_images_are_named() -> None:
    record = current_record(DataConfig(), ByteTokenizer())
    assert [(f["option"], f["file"], f["size"]) for f in record["files"]] == [
        ("data.path", "<embedded corpus>", 322_340)
    ]
    assert record["tokenizer"]["name"] == "bytes"
    assert current_record(DataConfig(), None) == {
        "generated": "images",
        "files": [],
        "tokenizer": None,
        "accepted": [],
    }


def listed(record: dict, root: Path) -> list[tuple[str, str]]:
    return [(f["option"], Path(f["file"]).relative_to(root).as_posix()) for f in record["files"]]


def test_the_files_recorded_are_those_read(tmp_path: Path) -> None:
    for name in ("gpt", "held"):
        (tmp_path / name).mkdir()
        np.arange(50, dtype=np.uint16).tofile(tmp_path / name / "train.bin")
        np.arange(40, dtype=np.uint16).tofile(tmp_path / name / "val.bin")
    own = current_record(DataConfig(path=str(tmp_path / "gpt")), TokenIds(50))
    assert listed(own, tmp_path) == [("data.path", "gpt/train.bin"), ("data.path", "gpt/val.bin")]
    # With data.val_path, data.path's own val.bin is not read.
    other = current_record(
        DataConfig(path=str(tmp_path / "gpt"), val_path=str(tmp_path / "held")), TokenIds(50)
    )
    assert listed(other, tmp_path) == [("data.path", "gpt/train.bin"), ("data.val_path", "held/train.bin")]


def test_a_folder_that_gained_and_lost_files_is_refused_listing_each(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("a.txt", "b.txt"):
        (docs / name).write_text(f"text of {name}\n" * 20)
    data = DataConfig(path=str(docs))
    recorded(tmp_path / "run", data)
    (docs / "a.txt").unlink()
    (docs / "c.txt").write_text("new text")
    with pytest.raises(ConfigError) as caught:
        check_data_identity(tmp_path / "run", current_record(data, ByteTokenizer()), None, 5, False)
    message = str(caught.value)
    assert message.startswith("data.path: the data changed since the run started")
    assert (
        f"'{docs / 'a.txt'}' is no longer read (280 bytes when recorded); '{docs / 'c.txt'}' is new (8 bytes)"
        in message
    )
    assert message.endswith("resume with --accept-data-change to train on it from step 5")
    accepted = check_data_identity(tmp_path / "run", current_record(data, ByteTokenizer()), None, 5, True)
    assert isinstance(accepted, DataIdentity) and accepted.stale
    assert accepted.record["accepted"][0]["step"] == 5 and len(accepted.record["accepted"][0]["changes"]) == 2


def test_a_damaged_record_is_named(tmp_path: Path) -> None:
    recorded(tmp_path / "run", DataConfig())
    (tmp_path / "run" / "data.json").write_text('{"files": [{"file": "x"}]}')
    with pytest.raises(
        ConfigError, match=r"--resume: '.*data.json' is not a data record \(TypeError: .*remove it"
    ):
        check_data_identity(tmp_path / "run", current_record(DataConfig(), ByteTokenizer()), None, 2, False)
