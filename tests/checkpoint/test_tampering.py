"""A checkpoint whose files were rewritten together with its manifest still fails in one error naming
the file (never EOFError, ZeroDivisionError or an unpickling traceback), and an empty or partial
manifest is refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from small_checkpoint import save_small_checkpoint, small_model

from brickwork.checkpoint import UNLISTED, UnsafeCheckpointError, export
from brickwork.checkpoint.manifest import MANIFEST_FILE, CorruptCheckpointError, write_manifest
from brickwork.parallel import load_checkpoint


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    return save_small_checkpoint(tmp_path / "ckpt")


def _shard(folder: Path) -> str:
    (shard,) = folder.glob("*.distcp")
    return shard.name


def _tamper(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "empty":
        path.write_bytes(b"")
    elif how == "half":
        path.write_bytes(data[: len(data) // 2])
    else:  # the same length of bytes that mean nothing
        path.write_bytes(bytes((i * 37 + 11) % 256 for i in range(len(data))))


@pytest.mark.parametrize("how", ["empty", "half", "garbage"])
@pytest.mark.parametrize("name", [".metadata", "shard", "rng/rank0.pt", "meta.json"])
def test_a_rewritten_file_with_a_matching_manifest_is_named(
    saved: Path, tmp_path: Path, name: str, how: str
) -> None:
    name = _shard(saved) if name == "shard" else name
    _tamper(saved / name, how)
    write_manifest(saved, skip=UNLISTED)  # the forger makes the manifest agree
    attempts = [
        lambda: load_checkpoint(saved, small_model(1), torch.optim.AdamW(small_model(1).parameters()))
    ]
    if name != "rng/rank0.pt":  # export reads the weights, not the RNG states
        attempts.append(lambda: export(saved, tmp_path / "out.safetensors"))
    for attempt in attempts:
        with pytest.raises((CorruptCheckpointError, UnsafeCheckpointError)) as caught:
            attempt()
        message = str(caught.value)
        assert Path(name).name in message or str(saved) in message, message
        assert "\n" not in message


@pytest.mark.parametrize(("key", "value"), [("world_size", 0), ("step", -1), ("step", "one"), ("extra", [1])])
def test_a_rewritten_meta_json_with_impossible_values_is_named(saved: Path, key: str, value: object) -> None:
    meta = json.loads((saved / "meta.json").read_text())
    meta[key] = value
    (saved / "meta.json").write_text(json.dumps(meta))
    write_manifest(saved, skip=UNLISTED)
    with pytest.raises(CorruptCheckpointError, match=rf"meta\.json is damaged: {key} is"):
        load_checkpoint(saved, small_model(1))


def test_an_empty_manifest_is_refused(saved: Path) -> None:
    (saved / MANIFEST_FILE).write_text(json.dumps({"algorithm": "crc32", "files": {}}))
    with pytest.raises(CorruptCheckpointError, match=r"manifest\.json does not list meta\.json"):
        load_checkpoint(saved, small_model(1))


def test_a_partial_manifest_is_refused_naming_the_unlisted_file(saved: Path, tmp_path: Path) -> None:
    manifest = json.loads((saved / MANIFEST_FILE).read_text())
    shard = _shard(saved)
    del manifest["files"][shard]
    (saved / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(CorruptCheckpointError, match=rf"does not list .*{shard}"):
        load_checkpoint(saved, small_model(1))
    with pytest.raises(CorruptCheckpointError, match=shard):
        export(saved, tmp_path / "out.safetensors")


def test_a_manifest_entry_that_is_not_a_size_and_checksum_is_refused(saved: Path) -> None:
    manifest = json.loads((saved / MANIFEST_FILE).read_text())
    manifest["files"]["meta.json"] = "trust me"
    (saved / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(CorruptCheckpointError, match=r"its entry for 'meta\.json'"):
        load_checkpoint(saved, small_model(1))


def test_an_untampered_checkpoint_still_loads_exactly(saved: Path) -> None:
    model = small_model(1)
    load_checkpoint(saved, model)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), _model_after_step().values()))


def _model_after_step() -> dict[str, torch.Tensor]:
    model = small_model(0)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 16)).sum().backward()
    optimizer.step()
    return model.state_dict()


class _TouchesAFile:
    """Pickles as a call of os.system that would create a file, were it loaded unrestricted."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def test_a_refused_rng_file_is_named_without_advice_to_load_it_unrestricted(
    saved: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "payload-ran"
    torch.save({"cpu": _TouchesAFile(marker)}, saved / "rng" / "rank0.pt")
    write_manifest(saved, skip=UNLISTED)
    with pytest.raises(CorruptCheckpointError) as caught:
        load_checkpoint(saved, small_model(1))
    message = str(caught.value)
    assert "rank0.pt cannot be read" in message and f"it names {os.system.__module__}.system" in message
    assert "weights_only" not in message and "allowlist" not in message and "\n" not in message
    assert not marker.exists()
