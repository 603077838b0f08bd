"""Reading DCP checkpoints without running code from them.

torch's ``FileSystemReader.read_metadata`` calls ``pickle.load`` on the checkpoint's ``.metadata``, and
a pickle can call any importable function while it loads (``os.system`` through ``__reduce__``, say).
``SafeFileSystemReader`` is that reader with ``.metadata`` read by ``MetadataUnpickler``, which resolves
only the names a DCP metadata pickle holds: the DCP metadata dataclasses, torch sizes, dtypes and
layouts, and plain containers. Any other name stops the load before anything is built from it, with
an error naming it, every file it points to must lie inside the checkpoint folder, and each must be
long enough to hold the bytes the metadata places in it.

The data files are read by torch: tensors with ``torch.load(weights_only=True)``, but entries the
metadata marks as non-tensor "bytes" with ``torch.load(weights_only=False)`` in DCP's default load
planner, so a crafted ``.metadata`` could mark a weight as bytes and point it at a pickle that runs
code. ``SafeLoadPlanner`` first reads such an entry with ``weights_only=True`` and refuses it when
that fails; only data that loader accepts reaches torch's own.

When ``torch.load(weights_only=True)`` refuses a file, torch's message advises loading it again with
``weights_only=False`` or allow-listing what it names: for a file that may have been tampered with,
that is advice to run its code. ``refusal_reason`` says why in brickwork's words instead, and every
reader that relays such a refusal (here, folder.py, the HF folder reader) goes through it.
"""

from __future__ import annotations

import io
import os
import pickle
import re
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from brickwork.checkpoint.manifest import CorruptCheckpointError

_METADATA = "torch.distributed.checkpoint.metadata"
# Each module's names that a DCP ``.metadata`` pickle may refer to. Every one is a plain data class,
# an enum, a torch dtype/size/layout, or a function that only maps a string to a torch layout.
ALLOWED: dict[str, frozenset[str]] = {
    _METADATA: frozenset(
        {
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorStorageMetadata",
            "TensorProperties",
            "ChunkStorageMetadata",
            "BytesStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.distributed.checkpoint.planner": frozenset({"LoadItemType", "WriteItemType"}),
    # Every dtype torch names (torch.float32, ...), and the sizes and layouts tensors are described by.
    "torch": frozenset(
        {"Size", "strided", "sparse_coo"}
        | {n for n in dir(torch) if isinstance(getattr(torch, n), torch.dtype)}
    ),
    "torch.serialization": frozenset({"_get_layout"}),
    "pathlib": frozenset({"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}),
    "collections": frozenset({"OrderedDict"}),
    "builtins": frozenset({"set", "frozenset"}),
}


class UnsafeCheckpointError(pickle.UnpicklingError, ValueError):
    """A checkpoint's metadata refers to something a DCP metadata pickle never holds."""


class MetadataUnpickler(pickle.Unpickler):
    """Resolves only the names in ``ALLOWED``; any other raises UnsafeCheckpointError."""

    def __init__(self, file: io.BufferedIOBase, source: str) -> None:
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        if name in ALLOWED.get(module, ()):
            return super().find_class(module, name)
        raise UnsafeCheckpointError(
            f"{self.source} refers to {module}.{name}, which a checkpoint's metadata never holds; "
            "refusing to load it (it could run code)"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeCheckpointError(
            f"{self.source} holds a persistent reference, which DCP metadata never has"
        )


class SafeFileSystemReader(FileSystemReader):
    """torch's ``FileSystemReader`` with ``.metadata`` read by ``MetadataUnpickler``.

    Pass it to ``dcp.load(..., storage_reader=SafeFileSystemReader(path))``.
    """

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        # The same file names torch's reader uses: one global ``.metadata``, or ``__<rank>.metadata``.
        name = ".metadata" if rank is None else f"__{rank}.metadata"
        path = os.path.join(os.fspath(self.path), name)
        with open(path, "rb") as handle:
            try:
                metadata = MetadataUnpickler(handle, path).load()
            except UnsafeCheckpointError:
                raise
            except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as err:
                raise CorruptCheckpointError(f"{path} is damaged: {type(err).__name__}: {err}") from None
        if not isinstance(metadata, Metadata):
            raise UnsafeCheckpointError(f"{path} holds a {type(metadata).__name__}, not DCP Metadata")
        ends: dict[str, int] = {}
        for info in (metadata.storage_data or {}).values():
            relative = getattr(info, "relative_path", "")
            _check_inside(relative, path)
            ends[relative] = max(ends.get(relative, 0), _end(info, path))
        for relative, end in ends.items():
            _check_length(os.path.join(os.fspath(self.path), relative), end, path)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _check_inside(relative_path: str, source: str) -> None:
    """A data file named by the metadata must be a plain path below the checkpoint folder."""
    parts = relative_path.replace("\\", "/").split("/")
    if not relative_path or os.path.isabs(relative_path) or ".." in parts:
        raise UnsafeCheckpointError(
            f"{source} points outside its checkpoint folder ({relative_path!r}); refusing to read it"
        )


def _end(info: Any, source: str) -> int:
    """Where an entry's bytes end in its data file, from the metadata's offset and length."""
    offset, length = getattr(info, "offset", None), getattr(info, "length", None)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (offset, length)):
        raise CorruptCheckpointError(f"{source} is damaged: an entry's offset {offset!r}, length {length!r}")
    return offset + length


def _check_length(data_file: str, end: int, source: str) -> None:
    """A data file must hold every byte the metadata places in it: a shorter one was cut off."""
    try:
        size = os.path.getsize(data_file)
    except OSError:
        raise CorruptCheckpointError(f"{data_file} is missing, but {source} names it") from None
    if size < end:
        raise CorruptCheckpointError(
            f"{data_file} has {size} bytes, but {source} places data up to byte {end} (truncated?)"
        )


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, with non-tensor entries checked by ``torch.load(weights_only=True)``
    before torch's own ``load_bytes`` reads them. Pass it to ``dcp.load(..., planner=SafeLoadPlanner())``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            torch.load(value, weights_only=True)
        except Exception as err:  # any failure of the restricted loader means the data is not plain
            reason = refusal_reason(err) or f"{type(err).__name__}: {' '.join(str(err).split())[:200]}"
            raise UnsafeCheckpointError(
                f"the checkpoint entry {read_item.dest_index.fqn!r} is not plain data ({reason})"
            ) from None
        value.seek(0)
        super().load_bytes(read_item, value)


def refusal_reason(err: BaseException) -> str | None:
    """Why ``torch.load(weights_only=True)`` refused a file, in brickwork's words (the name it would
    have called, when it names one); None when ``err`` is no such refusal (a truncated file, say)."""
    if not (isinstance(err, pickle.UnpicklingError) and "weights_only" in str(err)):
        return None
    named = re.search(r"GLOBAL ([\w.]+)", str(err))
    what = f"it names {named.group(1)}, which" if named else "it holds something"
    return f"{what} plain weights never do; refused, as loading it could run code"


def read_metadata(directory: str | os.PathLike) -> Metadata:
    """The DCP metadata of the checkpoint in ``directory``, read without running code from it."""
    return SafeFileSystemReader(directory).read_metadata()
