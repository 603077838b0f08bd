"""Writing a weights file: whole or not at all, with the permissions the umask gives, and a failed write
as one error naming the file and why.

safetensors writes through a temporary file of mode 0600, which it renames, so its files ignore the
umask: an export in a shared folder would be unreadable to the group. ``write_partial`` writes beside
the final name and gives the file the mode a new file gets here; the caller renames it into place,
so the final name holds the previous file or the new one whole. A full disk or a file size limit
ends in one OSError naming the final file and the cause, the previous file unchanged.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

# Causes of a failed write, said plainly; any other is the system's own words.
CAUSES = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "the file size limit was reached",
}


def partial_path(final: Path) -> Path:
    """Where ``final`` is written before it is renamed into place; the suffix names the format."""
    return final.with_name(f".{final.stem}.partial{final.suffix}")


def write_partial(weights: dict[str, torch.Tensor], final: Path, metadata: dict[str, str]) -> Path:
    """Write ``weights`` as a safetensors file at :func:`partial_path` of ``final``, with the mode a
    new file gets in its folder (0o666 less the umask); returns the partial path, for the caller to
    rename into place, once it is flushed to the disk. A failed write removes it and raises the error of
    :func:`writing`."""
    partial = partial_path(final)
    with writing(final, partial):
        # Created here afresh (not one a crash left), the file gets the umask's mode; safetensors'
        # rename of its own temporary file over it then resets the mode, which is set again below.
        partial.unlink(missing_ok=True)
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            mode = stat.S_IMODE(os.fstat(descriptor).st_mode)
        finally:
            os.close(descriptor)
        save_file(weights, partial, metadata=metadata)
        descriptor = os.open(partial, os.O_RDONLY)
        try:
            os.fchmod(descriptor, mode)
            os.fsync(descriptor)  # the bytes are on the disk before a rename points the final name at them
        finally:
            os.close(descriptor)
    return partial


@contextlib.contextmanager
def writing(final: Path, partial: Path | None = None) -> Iterator[None]:
    """An OSError raised while writing ``final`` (or the safetensors error wrapping one) as one OSError
    with its errno, naming ``final`` and the cause; ``partial``, the file being written, is removed."""
    try:
        yield
    except (OSError, SafetensorError) as err:
        code = err.errno if isinstance(err, OSError) else _wrapped_errno(err)
        if code is None:
            raise
        if partial is not None:
            with contextlib.suppress(OSError):  # never written, or on a file system that refuses all
                partial.unlink()
        cause = f"{CAUSES[code]} ({os.strerror(code)})" if code in CAUSES else os.strerror(code)
        raise OSError(
            code, f"could not be written: {cause}; any file there before is unchanged", str(final)
        ) from None


def _wrapped_errno(err: SafetensorError) -> int | None:
    """The errno safetensors' Rust writer reports in its message (``... (os error 28)``), if any."""
    found = re.search(r"os error (\d+)", str(err))
    return int(found.group(1)) if found else None
