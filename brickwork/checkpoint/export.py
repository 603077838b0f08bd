"""``export(dir, out.safetensors)``: a distributed checkpoint as one single-process weights file.

DCP already knows every tensor's global shape, so reading each ``model.<name>`` whole in one process
(no process group) merges the shards of any layout; nothing is merged by hand. The file holds the
single-process state dict (tied names each with their own copy), with the resolved spec and the step
in its metadata, and loads with ``build_model(spec).load_state_dict(safetensors.torch.load_file(out))``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from brickwork.checkpoint.folder import (
    open_checkpoint,
    quiet_single_process,
    reading,
)
from brickwork.checkpoint.safe_reader import SafeLoadPlanner
from brickwork.checkpoint.safe_write import write_partial, writing

SPEC_KEY = "spec"  # the metadata entry holding the resolved spec, as JSON


def export(directory: str | os.PathLike, out: str | os.PathLike, *, verify: bool = True) -> Path:
    """Write the model weights of the complete checkpoint in ``directory`` to the safetensors file ``out``.

    Runs in one process (call it on one rank only, or outside any process group). The metadata holds
    ``spec`` (JSON) and ``step``. Raises FileNotFoundError for an interrupted or missing checkpoint,
    CorruptCheckpointError naming the file for a damaged one and UnsafeCheckpointError for an unsafe one.
    ``out`` is replaced whole, with the mode the umask gives; a write that fails (a full disk) leaves
    any earlier ``out`` as it was and raises an OSError naming it and the cause (safe_write.py).
    ``verify=False``: as in :func:`read_checkpoint_weights`.
    """
    weights, meta = read_checkpoint_weights(directory, verify=verify)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    metadata = {SPEC_KEY: json.dumps(meta.get("spec")), "step": str(meta["step"])}
    partial = write_partial(weights, out, metadata)
    with writing(out, partial):
        os.replace(partial, out)
    return out


def read_export(file: str | os.PathLike) -> tuple[str, dict[str, torch.Tensor], dict[str, str]]:
    """(the spec as JSON text, the weights, all the metadata) of a file :func:`export` wrote.

    ValueError naming the file when it is not a readable safetensors file or carries no spec (it was
    not written by ``brickwork export``); FileNotFoundError when it is missing.
    """
    path = Path(file)
    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r} does not exist")
    try:
        with safe_open(str(path), framework="pt") as reader:
            metadata = reader.metadata() or {}
    except (SafetensorError, OSError) as err:
        raise _unreadable(path, err) from None
    if not metadata.get(SPEC_KEY):
        raise ValueError(
            f"{str(path)!r} carries no brickwork spec in its metadata: it was not written by brickwork "
            "export; load a save_pretrained folder, or an HF folder, by its folder"
        )
    return metadata[SPEC_KEY], read_weights(path), metadata


def read_weights(file: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file; ValueError naming it when it is damaged or not one."""
    path = Path(file)
    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r} does not exist")
    try:
        return load_file(path)
    except (SafetensorError, OSError) as err:
        raise _unreadable(path, err) from None


def _unreadable(path: Path, err: Exception) -> ValueError:
    return ValueError(f"{str(path)!r} is not a readable safetensors file: {err}")


def read_checkpoint_weights(
    directory: str | os.PathLike, *, verify: bool = True
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(the single-process model weights, the checkpoint's metadata: ``spec``, ``step``, ...) of the
    complete checkpoint in ``directory``, read in this one process; the errors of :func:`export`.
    ``verify``: as in :func:`~brickwork.checkpoint.folder.open_checkpoint`."""
    folder, meta, reader, stored = open_checkpoint(directory, verify=verify)
    state = {
        key: torch.empty(tuple(md.size), dtype=md.properties.dtype)
        for key, md in stored.items()
        if key.startswith("model.") and isinstance(md, TensorStorageMetadata)
    }
    with reading(folder), quiet_single_process():
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
    return {key[len("model.") :]: tensor.contiguous() for key, tensor in state.items()}, meta
