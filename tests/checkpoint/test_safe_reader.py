"""A crafted checkpoint cannot run code: ``.metadata`` is read by a restricted unpickler.

The crafted ``.metadata`` calls ``open(marker, "w")`` while it unpickles and then yields the real
metadata, so torch's own reader would resume from it as if nothing happened. Its manifest is rewritten
to match, as a forger would; the checksums are no defence against this, the reader is.
"""

from __future__ import annotations

import io
import pickle
import struct
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

from brickwork.checkpoint import UnsafeCheckpointError, export
from brickwork.checkpoint.manifest import write_manifest
from brickwork.checkpoint.safe_reader import read_metadata
from brickwork.parallel import load_checkpoint, save_checkpoint


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 3))


def _payload(call_module: str, call_name: str, args: tuple[str, ...]) -> bytes:
    """Protocol-2 opcodes that call ``module.name(*args)`` and drop the result."""
    out = b"c" + f"{call_module}\n{call_name}\n".encode() + b"("
    for arg in args:
        data = arg.encode()
        out += b"X" + struct.pack("<I", len(data)) + data
    return out + b"tR0"


def _craft(folder: Path, marker: Path) -> None:
    real = pickle.loads((folder / ".metadata").read_bytes())  # our own, trusted save
    body = pickle.dumps(real, protocol=2)
    assert body[:2] == b"\x80\x02"
    (folder / ".metadata").write_bytes(
        b"\x80\x02" + _payload("builtins", "open", (str(marker), "w")) + body[2:]
    )
    write_manifest(folder, skip=(".complete", ".complete.tmp"))


@pytest.fixture
def crafted(tmp_path: Path) -> tuple[Path, Path]:
    folder = tmp_path / "ckpt"
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    save_checkpoint(folder, model, optimizer, 3)
    marker = tmp_path / "payload-ran"
    _craft(folder, marker)
    return folder, marker


def test_the_crafted_metadata_would_run_its_payload_under_torchs_reader(crafted: tuple[Path, Path]) -> None:
    # The premise: torch's reader runs the payload and then returns usable metadata.
    folder, marker = crafted
    stored = FileSystemReader(folder).read_metadata().state_dict_metadata
    assert marker.exists() and "model.0.weight" in stored


def test_resume_refuses_the_crafted_metadata_and_the_payload_never_runs(crafted: tuple[Path, Path]) -> None:
    folder, marker = crafted
    with pytest.raises(UnsafeCheckpointError, match=r"builtins\.open"):
        load_checkpoint(folder, _model(), torch.optim.SGD(_model().parameters(), lr=0.1))
    assert not marker.exists()


def test_export_refuses_the_crafted_metadata_and_the_payload_never_runs(
    crafted: tuple[Path, Path], tmp_path: Path
) -> None:
    folder, marker = crafted
    with pytest.raises(UnsafeCheckpointError, match=r"builtins\.open"):
        export(folder, tmp_path / "out.safetensors")
    assert not marker.exists()
    assert not (tmp_path / "out.safetensors").exists()


class _OpensAFile:
    """Pickles as a call to ``open(path, "w")``."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple:
        return (open, (self.path, "w"))


def _rewrite_metadata(folder: Path, edit) -> None:
    metadata = pickle.loads((folder / ".metadata").read_bytes())
    edit(metadata)
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    write_manifest(folder, skip=(".complete", ".complete.tmp"))


def test_a_weight_marked_as_pickled_bytes_is_refused_and_its_payload_never_runs(tmp_path: Path) -> None:
    # DCP reads a "bytes" entry with torch.load(weights_only=False); the metadata decides which
    # entries are bytes, so a crafted one can turn any weight into a pickle that runs code.
    folder, marker = tmp_path / "ckpt", tmp_path / "payload-ran"
    save_checkpoint(folder, _model(), None, 1)
    buffer = io.BytesIO()
    torch.save(_OpensAFile(marker), buffer)
    (folder / "evil.distcp").write_bytes(buffer.getvalue())

    def mark_as_bytes(metadata) -> None:
        metadata.state_dict_metadata["model.0.bias"] = BytesStorageMetadata()
        metadata.storage_data = {k: v for k, v in metadata.storage_data.items() if k.fqn != "model.0.bias"}
        metadata.storage_data[MetadataIndex("model.0.bias")] = _StorageInfo("evil.distcp", 0, buffer.tell())

    _rewrite_metadata(folder, mark_as_bytes)
    with pytest.raises(UnsafeCheckpointError, match=r"'model\.0\.bias' is not plain data .*open"):
        load_checkpoint(folder, _model())
    assert not marker.exists()


def test_a_data_file_outside_the_checkpoint_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    save_checkpoint(folder, _model(), None, 1)

    def point_outside(metadata) -> None:
        for info in metadata.storage_data.values():
            info.relative_path = "../../elsewhere.distcp"

    _rewrite_metadata(folder, point_outside)
    with pytest.raises(UnsafeCheckpointError, match=r"points outside its checkpoint folder \('\.\./\.\./"):
        load_checkpoint(folder, _model())


def test_a_class_outside_dcp_metadata_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / ".metadata").write_bytes(pickle.dumps(nn.Linear, protocol=2))
    with pytest.raises(UnsafeCheckpointError, match=r"torch\.nn\.modules\.linear\.Linear"):
        read_metadata(tmp_path)


def test_a_real_checkpoint_still_loads_with_its_weights(tmp_path: Path) -> None:
    model = _model()
    save_checkpoint(tmp_path / "ckpt", model, None, 1)
    other = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 3))
    meta = load_checkpoint(tmp_path / "ckpt", other)
    assert meta["step"] == 1
    for a, b in zip(model.state_dict().values(), other.state_dict().values()):
        assert torch.equal(a, b)
