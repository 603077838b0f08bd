"""Every file of a checkpoint is checked against its manifest before anything is loaded from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from small_checkpoint import save_small_checkpoint, small_model

from brickwork.checkpoint import export
from brickwork.checkpoint.manifest import MANIFEST_FILE, CorruptCheckpointError, file_crc32
from brickwork.parallel import load_checkpoint


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    return save_small_checkpoint(tmp_path / "ckpt")


def _shard(folder: Path) -> Path:
    (shard,) = folder.glob("*.distcp")
    return shard


def test_the_manifest_lists_every_file_with_its_size_and_crc32(saved: Path) -> None:
    manifest = json.loads((saved / MANIFEST_FILE).read_text())
    on_disk = {
        p.relative_to(saved).as_posix()
        for p in saved.rglob("*")
        if p.is_file() and p.name not in (MANIFEST_FILE, ".complete")
    }
    assert set(manifest["files"]) == on_disk and {".metadata", "meta.json", "rng/rank0.pt"} <= on_disk
    for name, entry in manifest["files"].items():
        assert entry == {"size": (saved / name).stat().st_size, "crc32": file_crc32(saved / name)}


def test_64_flipped_bytes_in_a_shard_are_detected_on_load_and_export(saved: Path, tmp_path: Path) -> None:
    shard = _shard(saved)
    data = bytearray(shard.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=rf"{shard.name} does not match its checksum"):
        load_checkpoint(saved, small_model(1))
    with pytest.raises(CorruptCheckpointError, match=shard.name):
        export(saved, tmp_path / "out.safetensors")


@pytest.mark.parametrize("name", [".metadata", "shard"])
def test_a_truncated_file_is_named_in_one_line(saved: Path, name: str) -> None:
    path = _shard(saved) if name == "shard" else saved / name
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CorruptCheckpointError, match=rf"{path.name} has \d+ bytes, the manifest says \d+"):
        load_checkpoint(saved, small_model(1))


def test_a_lost_file_or_manifest_is_refused(saved: Path) -> None:
    (saved / "rng" / "rank0.pt").unlink()
    with pytest.raises(CorruptCheckpointError, match=r"rank0\.pt is missing"):
        load_checkpoint(saved, small_model(1))
    (saved / MANIFEST_FILE).unlink()
    with pytest.raises(CorruptCheckpointError, match=r"has no manifest\.json"):
        load_checkpoint(saved, small_model(1))
