"""Rewriting a run's files so that a full disk or a kill leaves the old file or the new one, never a part.

The new content is written whole under a temporary name beside the file, flushed to the disk, and
renamed over the old one (``os.replace`` is atomic on POSIX). A write that fails removes the temporary
file and leaves the old one as it was.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from brickwork.errors import RunFailure


class RewriteError(RunFailure):
    """A run file could not be rewritten (a full disk, a file size limit); the old file is unchanged."""


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """``with replacing(path) as tmp:`` write the new content to ``tmp``; when the block ends without an
    error it replaces ``path``. The temporary name keeps the suffix, for writers that go by it."""
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)  # the bytes are on the disk before the name points at them
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as err:
        reason = os.strerror(err.errno) if err.errno else str(err)
        raise RewriteError(
            f"could not rewrite {path} ({reason}); it is unchanged; free some space and run again"
        ) from None
    finally:
        tmp.unlink(missing_ok=True)
