"""One training process per run folder: an exclusive ``fcntl`` lock on ``RUN/.lock`` while it trains.

Two runs writing one folder interleave their ``metrics.jsonl`` records and overwrite each other's
checkpoints. The lock is ``flock`` on an open file: the kernel drops it when the holder exits, however
it exits, so a crashed run never leaves a stale lock behind. The file keeps the holder's pid so that a
refused run can name it. Under torchrun, rank 0 holds the lock for the whole run.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from brickwork.errors import ConfigError

LOCK_FILE = ".lock"


class RunLock:
    """``with RunLock(run_dir, option):`` holds the run folder's lock, creating the folder if needed
    (and removing it again if the run ends before writing anything into it).

    A folder locked by another process raises a ConfigError naming its pid and ``option`` (the
    argument that chose the folder). Processes other than rank 0 take no lock.
    """

    def __init__(self, run_dir: Path, option: str = "--resume") -> None:
        self.run_dir = Path(run_dir)
        self.option = option
        self._fd: int | None = None
        self._created = False

    def __enter__(self) -> RunLock:
        if os.environ.get("RANK", "0") != "0":
            return self
        if self.run_dir.exists() and not self.run_dir.is_dir():
            raise ConfigError(f"{str(self.run_dir)!r} is a file, not a run folder", self.option)
        self._created = not self.run_dir.exists()
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
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._fd is not None:
            # A run that failed before writing anything leaves no folder behind it.
            if self._created and [p.name for p in self.run_dir.iterdir()] == [LOCK_FILE]:
                (self.run_dir / LOCK_FILE).unlink()
                self.run_dir.rmdir()
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
