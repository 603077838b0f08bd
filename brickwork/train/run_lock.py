"""One training process per run folder: an exclusive ``fcntl`` lock on ``RUN/.lock`` while it trains.

Two runs writing one folder interleave their ``metrics.jsonl`` records and overwrite each other's
checkpoints. The lock is ``flock`` on an open file: the kernel drops it when the holder exits, however
it exits, so a crashed run never leaves a stale lock behind. The file keeps the holder's pid so that a
refused run can name it. Under torchrun, rank 0 holds the lock for the whole run.

The lock is the only truth about who owns the folder: a process refused it never creates, changes or
removes anything there (it may have seen the folder missing a moment before the winner made it), and
only the holder cleans up after a run that failed before it became one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from pathlib import Path
from types import TracebackType

from brickwork.errors import ConfigError
from brickwork.launch_env import is_first_rank

LOCK_FILE = ".lock"


class RunLock:
    """``with RunLock(run_dir, option) as lock:`` holds the run folder's lock, creating the folder if
    needed (and removing it again if the run ends before writing anything into it). ``lock.created``
    says whether this process made the folder and holds it.

    A folder locked by another process raises a ConfigError naming its pid and ``option`` (the
    argument that chose the folder). Processes other than rank 0 take no lock.
    """

    def __init__(self, run_dir: Path, option: str = "--resume") -> None:
        self.run_dir = Path(run_dir)
        self.option = option
        self._fd: int | None = None
        self.created = False

    def __enter__(self) -> RunLock:
        if not is_first_rank():
            return self
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise ConfigError(f"{str(self.run_dir)!r} is a file, not a run folder", self.option)
        created = not self.run_dir.exists()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ConfigError(
                f"{str(self.run_dir)!r} is in use by another training process (pid {holder}); "
                "wait for it to finish or stop it first",
                self.option,
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        self.created = created
        return self

    def clear(self) -> None:
        """Delete everything in the folder but the lock itself; only the holder may (RuntimeError else)."""
        if self._fd is None:
            raise RuntimeError(f"clearing {self.run_dir} without holding its lock")
        for path in self.run_dir.iterdir():
            if path.name == LOCK_FILE:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._fd is not None:
            # A run that failed before writing anything leaves no folder behind it.
            if self.created and [p.name for p in self.run_dir.iterdir()] == [LOCK_FILE]:
                (self.run_dir / LOCK_FILE).unlink()
                with contextlib.suppress(OSError):  # a process that came just now has made it its own
                    self.run_dir.rmdir()
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
