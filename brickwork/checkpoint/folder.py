"""What a checkpoint folder holds, and how it is checked and read in one process.

A checkpoint is a folder:

- the DCP files (``.metadata`` and the ``*.distcp`` shards): ``model.<name>`` for every tensor of the
  model's state dict and ``optim.<name>.<key>`` for the optimizer state of each parameter, named by
  the single-process model's names (``brickwork.parallel.save_checkpoint`` writes them from any layout);
- ``rng/rank<r>.pt``: each rank's RNG state;
- ``meta.json``: the step, the resolved spec, the dist dict, the world size, the optimizer's
  hyperparameters (param groups without their tensors) and the caller's ``extra``;
- ``manifest.json``: the size and CRC-32 of every file above (manifest.py), checked before anything
  is loaded;
- ``.complete``, written last, after every rank has finished. A folder without it is an interrupted
  save and is never loaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.api import CheckpointException

from brickwork.checkpoint.manifest import CorruptCheckpointError, verify_manifest
from brickwork.checkpoint.safe_reader import SafeFileSystemReader, UnsafeCheckpointError, refusal_reason

COMPLETE_MARKER = ".complete"
META_FILE = "meta.json"
# Files the manifest does not list (the marker is written after it), and files it must list.
UNLISTED = (COMPLETE_MARKER, COMPLETE_MARKER + ".tmp")
REQUIRED = (META_FILE, ".metadata")


def is_complete(directory: str | os.PathLike) -> bool:
    """Whether ``directory`` holds a checkpoint whose save finished (its ``.complete`` marker)."""
    return (Path(directory) / COMPLETE_MARKER).is_file()


def mark_complete(folder: Path) -> None:
    """Write the ``.complete`` marker, to a temporary name renamed into place: it is absent or whole."""
    tmp = folder / (COMPLETE_MARKER + ".tmp")
    tmp.write_text("complete\n")
    os.replace(tmp, folder / COMPLETE_MARKER)


def verify_checkpoint(directory: str | os.PathLike) -> None:
    """Check a checkpoint's files against its manifest (manifest.py), which must list every file the
    folder holds; CorruptCheckpointError names the first one that fails."""
    verify_manifest(directory, unlisted=UNLISTED, required=REQUIRED)


def open_checkpoint(
    directory: str | os.PathLike, *, verify: bool = True
) -> tuple[Path, dict[str, Any], SafeFileSystemReader, dict[str, Any]]:
    """A complete checkpoint opened for loading: (its folder, its ``meta.json``, a DCP reader that runs
    no code from it, the stored entries' metadata by name). FileNotFoundError for an interrupted save.
    Its files are checked against the manifest first; ``verify=False`` skips that check (it reads every
    byte) for a folder the caller has just checked."""
    folder = Path(directory)
    if not is_complete(folder):
        raise FileNotFoundError(
            f"{folder} is not a complete checkpoint (no {COMPLETE_MARKER} marker: the save was interrupted "
            "or never ran)"
        )
    if verify:
        verify_checkpoint(folder)
    meta = read_meta(folder)
    reader = SafeFileSystemReader(folder)
    with reading(folder / ".metadata"):
        stored = dict(reader.read_metadata().state_dict_metadata)
    return folder, meta, reader, stored


def read_meta(directory: str | os.PathLike) -> dict[str, Any]:
    """A checkpoint's ``meta.json``, checked for the keys loading relies on; CorruptCheckpointError
    names the file when it is damaged."""
    path = Path(directory) / META_FILE
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CorruptCheckpointError(f"{path} cannot be read: {type(err).__name__}: {err}") from None
    if not isinstance(meta, dict):
        raise CorruptCheckpointError(f"{path} holds a {type(meta).__name__}, not a JSON object")
    for key in ("step", "world_size"):
        value = meta.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if key == "world_size" else 0):
            raise CorruptCheckpointError(f"{path} is damaged: {key} is {value!r}")
    if not isinstance(meta.get("extra", {}), dict):
        raise CorruptCheckpointError(f"{path} is damaged: extra is {meta['extra']!r}")
    return meta


@contextlib.contextmanager
def quiet_single_process() -> Iterator[None]:
    """Silence DCP's warning that, with no process group, it assumes one process: that is meant here.

    DCP also wraps what its reads and writes raise into a CheckpointException. A Ctrl-C is raised
    again here as the KeyboardInterrupt it was, so the caller stops as it would anywhere else, and a
    refused entry as the UnsafeCheckpointError it was, so the caller gets its one-line message.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        try:
            yield
        except CheckpointException as err:
            causes = [f[0] if isinstance(f, tuple) else f for f in err.failures.values()]
            if causes and all(isinstance(c, KeyboardInterrupt) for c in causes):
                raise KeyboardInterrupt from None
            unsafe = [c for c in causes if isinstance(c, UnsafeCheckpointError)]
            if unsafe:
                raise unsafe[0] from None
            raise


@contextlib.contextmanager
def reading(path: Path) -> Iterator[None]:
    """Whatever reading ``path`` raises (EOFError, an unpickling error, a shape mismatch, DCP's
    CheckpointException around any of them) as one CorruptCheckpointError naming it; a file
    ``torch.load(weights_only=True)`` refused is said in brickwork's words, never torch's advice to
    load it unrestricted. A Ctrl-C and a refused unsafe entry pass through as they are."""
    try:
        yield
    except (KeyboardInterrupt, UnsafeCheckpointError, CorruptCheckpointError):
        raise
    except (Exception, CheckpointException) as err:  # any reader of a damaged file; each means the same
        cause = err
        if isinstance(err, CheckpointException):
            causes = [f[0] if isinstance(f, tuple) else f for f in err.failures.values()]
            cause = causes[0] if causes else err
        reason = refusal_reason(cause) or (str(cause).strip().splitlines() or [""])[0]
        raise CorruptCheckpointError(
            f"{path} cannot be read ({type(cause).__name__}: {reason[:300]}); it is damaged or was rewritten"
        ) from None
