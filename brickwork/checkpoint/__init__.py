"""The checkpoint format, read and checked in one process: what a checkpoint folder holds (folder.py),
its manifest of sizes and CRC-32s (manifest.py), its DCP metadata read without running code from it
(safe_reader.py), its model weights as one single-process file (export.py), the checkpoints of a
run folder (run_folder.py), and a saved model: the save_pretrained folder, and the spec and weights of
any of the forms from_pretrained reads (saved_model.py). Weights files are written whole, with the
umask's mode, a failed write naming the file (safe_write.py).

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
from brickwork.checkpoint.saved_model import (
    SPEC_FILE,
    WEIGHTS_FILE,
    SavedModel,
    read_saved_model,
    unique_weights,
    write_saved_model,
)

__all__ = [
    "COMPLETE_MARKER",
    "META_FILE",
    "SPEC_FILE",
    "UNLISTED",
    "WEIGHTS_FILE",
    "CorruptCheckpointError",
    "SavedModel",
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
    "read_saved_model",
    "read_weights",
    "unique_weights",
    "verify_checkpoint",
    "write_saved_model",
]
