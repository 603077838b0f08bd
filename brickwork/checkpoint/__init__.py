"""The checkpoint format, read and checked in one process: what a checkpoint folder holds (folder.py),
its manifest of sizes and CRC-32s (manifest.py), its DCP metadata read without running code from it
(safe_reader.py), its model weights as one single-process file (export.py), and the checkpoints of a
run folder (run_folder.py).

It sits below the factory, parallel/ and train/, which all read checkpoints; writing one from a
parallelized model, and loading one into it, is ``brickwork.parallel.save_checkpoint`` /
``load_checkpoint``.
"""

from brickwork.checkpoint.export import export, read_checkpoint_weights, read_export, read_weights
from brickwork.checkpoint.folder import (
    COMPLETE_MARKER,
    META_FILE,
    UNLISTED,
    is_complete,
    read_meta,
    verify_checkpoint,
)
from brickwork.checkpoint.manifest import CorruptCheckpointError
from brickwork.checkpoint.run_folder import (
    check_step_folder,
    checkpoint_dir,
    complete_checkpoints,
    folder_step,
    latest_checkpoint,
)
from brickwork.checkpoint.safe_reader import UnsafeCheckpointError

__all__ = [
    "COMPLETE_MARKER",
    "META_FILE",
    "UNLISTED",
    "CorruptCheckpointError",
    "UnsafeCheckpointError",
    "check_step_folder",
    "checkpoint_dir",
    "complete_checkpoints",
    "export",
    "folder_step",
    "is_complete",
    "latest_checkpoint",
    "read_checkpoint_weights",
    "read_export",
    "read_meta",
    "read_weights",
    "verify_checkpoint",
]
