"""A small progress bar on stderr: redrawn in place on a terminal, a line every 5% elsewhere (logs, CI)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``with Progress(total) as bar: ... bar.step("what just finished")``."""

    def __init__(self, total: int, stream: TextIO | None = None, width: int = 30) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream or sys.stderr
        self.width = width
        self.start = time.monotonic()
        self.interactive = self.stream.isatty()
        self._last_twentieth = -1

    def step(self, label: str = "") -> None:
        self.done += 1
        filled = self.width * self.done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.monotonic() - self.start
        line = f"[{bar}] {self.done}/{self.total} {elapsed:6.1f}s {label}"
        if self.interactive:
            self.stream.write("\r" + line[:160].ljust(160))
        elif (twentieth := 20 * self.done // self.total) != self._last_twentieth:
            self._last_twentieth = twentieth
            self.stream.write(line + "\n")
        self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.interactive:
            self.stream.write("\n")
            self.stream.flush()
