"""Checkpoints: DCP folders that reshard to any layout (save_load.py), checked against a manifest of
sizes and CRC-32s (manifest.py), read without running code from them (safe_reader.py), and
exported as one single-process safetensors file (export.py)."""

from brickwork.parallel.checkpoint.export import export, read_checkpoint_weights
from brickwork.parallel.checkpoint.save_load import (
    COMPLETE_MARKER,
    META_FILE,
    UNLISTED,
    is_complete,
    load_checkpoint,
    read_meta,
    save_checkpoint,
    verify_checkpoint,
)

__all__ = [
    "COMPLETE_MARKER",
    "META_FILE",
    "UNLISTED",
    "export",
    "is_complete",
    "load_checkpoint",
    "read_checkpoint_weights",
    "read_meta",
    "save_checkpoint",
    "verify_checkpoint",
]
